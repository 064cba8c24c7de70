#!/usr/bin/env bash
# What does a call cost the host, and are two GPUs faster than one: one script, one call of
# at most 9 minutes on a two-GPU machine (one GPU runs what needs one).
#
#   overhead  GPU 0: `quantcore bench overhead` — every quantcore kernel (called directly)
#             and module beside nn.Linear and F.linear, bf16 and fp16, M = 1, 16, 128, 1024:
#             host µs per call over a queue synchronised once, and CUDA-graph replay µs
#   check     the tensor-parallel check (conformance/tp/processes.py: each layer of a GPTQ
#             MLP block against the float64 golden and the unsharded kernels), world 2,
#             NCCL, one process per GPU; then again with the one-shot all-reduce over
#             symmetric memory (its sum also against NCCL's; SKIP with the reason where
#             symmetric memory cannot run), world 4 too where there are four GPUs
#   world4    the check with four ranks: NCCL, one process per GPU where there are four (GPTQ
#             4-bit, then AWQ, GPTQ 8-bit and act-order GPTQ cut by whole groups);
#             else sharing the two GPUs (gloo: NCCL refuses two ranks on one GPU; if gloo
#             cannot all-reduce CUDA tensors, again staged through the host)
#   bench     `quantcore bench tp_linear`, world 2, NCCL: the 70B-class (8192 → 28672) and
#             the 7B (4096 → 11008) MLP, M = 1, 16, 128, eager and CUDA graphs per rank,
#             the unsharded block on one GPU in the same run, the all-reduce alone, each
#             with NCCL's all-reduce and with the one-shot one (and which `auto` picks);
#             and each eager call's host µs alone (issued while a spin kernel holds the
#             GPU: the `-host` cases), with the block's parts (gate/up, activation, down);
#             with four GPUs also the 70B-class MLP over world 4
#   gloo, conformance   (only when named) the bench with two ranks sharing GPU 0 through
#             gloo; the tensor-parallel conformance matrix on cuda
#
# Each part runs under its own timeout, within what is left of BUDGET_S (530 s); a part
# that fails or runs out of time does not stop the next. NVLink multicast is kept off.
# Run from the repository root:
#   bash tools/probes/tp_linear_gpu.sh [overhead] [check] [world4] [bench] [gloo] [conformance]
# Everything goes under $OUT (default ./tp-linear-results): the log, tp_check_*.json (a
# check's exit code 2 is a skip, its reason in the JSON), and
# per part <part>/<device>/<suite>.json with <part>/<device>.md; the short table
# (tools/probes/host_cost_table.py) is printed last. PACK=PATH also packs all of it into one
# archive at PATH (for a machine that hands back only a few files: point OUT outside the folder it
# hands back, and PACK inside it; on one command line write PACK=… before OUT=…, as bash expands
# the assignments in order and a PACK written after would land inside the new OUT).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/tp-linear-results}"
BUDGET_S="${BUDGET_S:-530}"
mkdir -p "$OUT"
LOG="$OUT/tp_linear_gpu.log"
say() { echo "== $(date +%T) +${SECONDS}s $*" | tee -a "$LOG"; }

# A part's timeout: its own limit, or what is left of the budget (less a reserve for the table).
limit() {
  local left=$(( BUDGET_S - SECONDS - 10 ))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

# run NAME LIMIT_S COMMAND...: one part under its timeout, its output in the log.
run() {
  local name=$1 want=$2
  shift 2
  local t
  t=$(limit "$want")
  if [ "$t" -lt 20 ]; then
    say "$name: skipped, ${t}s left of the budget"
    return 124
  fi
  say "$name (timeout ${t}s)"
  # SIGINT first: Python unwinds, and the launcher's cleanup kills the ranks it started.
  timeout --signal=INT --kill-after=15 "$t" "$@" >>"$LOG" 2>&1
  local rc=$?
  say "$name rc=$rc"
  return "$rc"
}

python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 || say "pip install -e . failed"
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>>"$LOG" || echo 0)
say "$(nvidia-smi -L 2>&1 | tr '\n' ' ')— torch $(python3 -c 'import torch, triton; print(torch.__version__, "triton", triton.__version__)' 2>>"$LOG") sees $GPUS GPU(s)"
[ "$GPUS" -ge 1 ] || { say "no GPU: nothing to do"; exit 2; }

# check NAME WORLD BACKEND DEVICE [--stage-host] [--all-reduce PATH]: the TP check; its JSON
# report goes to NAME.json.
check() {
  local name=$1 world=$2 backend=$3 device=$4 t
  shift 4
  t=$(limit 120)
  if [ "$t" -lt 20 ]; then
    say "$name: skipped, ${t}s left of the budget"
    return 124
  fi
  say "$name: world $world, $backend on $device $* (timeout ${t}s)"
  timeout --signal=INT --kill-after=15 "$t" python3 -m quantcore.conformance.tp.processes --world "$world" \
      --backend "$backend" --device "$device" --hidden 2048 --inter 5632 --m 16 "$@" >"$OUT/$name.json" 2>>"$LOG"
  local rc=$?
  say "$name rc=$rc"
  return "$rc"
}

PARTS="${*:-overhead bench world4 check}"
has() { [[ " $PARTS " == *" $1 "* ]]; }

if has overhead; then
  run overhead 150 env CUDA_VISIBLE_DEVICES=0 python3 -m quantcore bench overhead --device cuda \
      --shapes default --rounds 5 --out "$OUT/overhead"
fi
# bench NAME: one tp_linear shape set, world as the set says, NCCL one process per GPU.
bench() {
  run "bench-$1" 200 env QUANTCORE_TP_BACKEND=nccl QUANTCORE_TP_DEVICE=cuda:rank \
      python3 -m quantcore bench tp_linear --device cuda --shapes "$1" --rounds 5 --out "$OUT/tp-nccl-$1"
}
# Most wanted first, each its own run (a cut-off part keeps the others): the 70B-class block
# over two GPUs, over four where there are four, the checks, then the 7B block.
if has bench && [ "$GPUS" -ge 2 ]; then
  bench 70b
  [ "$GPUS" -ge 4 ] && bench 70b-w4
fi
if has world4 && [ "$GPUS" -ge 4 ]; then
  check tp_check_w4_nccl 4 nccl cuda:rank
  # every other format a checkpoint is written in (conformance/tp/processes.py --format)
  check tp_check_w4_awq 4 nccl cuda:rank --format awq
  check tp_check_w4_gptq8 4 nccl cuda:rank --bits 8
  check tp_check_w4_gptq_act 4 nccl cuda:rank --desc-act --act-order groups
elif has world4; then
  if ! check tp_check_w4_shared 4 gloo cuda:shared; then
    say "world 4 on shared GPUs failed: again with the all-reduce staged through the host"
    check tp_check_w4_shared_staged 4 gloo cuda:shared --stage-host
  fi
fi
if has check && [ "$GPUS" -ge 2 ]; then
  check tp_check_w2_nccl 2 nccl cuda:rank
  check tp_check_w2_one_shot 2 nccl cuda:rank --all-reduce one_shot
  [ "$GPUS" -ge 4 ] && check tp_check_w4_one_shot 4 nccl cuda:rank --all-reduce one_shot
fi
if has bench && [ "$GPUS" -ge 2 ]; then
  bench 7b
fi
if has gloo; then
  run gloo-one-gpu 200 env QUANTCORE_TP_BACKEND=gloo QUANTCORE_TP_DEVICE=cuda \
      python3 -m quantcore bench tp_linear --device cuda --shapes 7b --rounds 5 --out "$OUT/tp-gloo-one-gpu"
fi
if has conformance; then
  run conformance 400 python3 -m pytest conformance/test_tp.py --qc-device cuda -v -n 0 -p no:cacheprovider \
      --tb=line -rfs
fi
say "done"
python3 -m tools.probes.host_cost_table "$OUT" 2>&1 | tee "$OUT/table.txt"
if [ -n "${PACK:-}" ]; then
  tar czf "$PACK" -C "$OUT" . && say "packed into $PACK"
fi
