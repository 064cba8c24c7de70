#!/usr/bin/env bash
# Do tensor-parallel quantized linears hold, and what do they cost, on GPUs: one script for a
# one- or two-GPU machine.
#
#   every machine  world=1 on GPU 0; then two processes sharing GPU 0 through gloo (NCCL
#                  refuses two ranks on one GPU; gloo all-reduces CUDA tensors — if it does
#                  not, the run is repeated with the all-reduce staged through the host)
#   two GPUs       two processes with NCCL, one GPU each (NVLink multicast kept off)
#
# In each: the check (conformance/tp/processes.py: each layer of a GPTQ MLP block — gate/up column-parallel, down
# row-parallel after the all-reduce — against the float64 golden and the unsharded kernels,
# conformance tolerance), then `quantcore bench tp_linear` (the block, its local part, the
# all-reduce alone, the unsharded block and dense bf16; Llama-7B MLP, M = 1, 16, 128). Once:
# the tensor-parallel conformance matrix on cuda (world 2 and 4, every kernel).
#
# Run it from the repository root on the GPU machine (it installs the checkout with
# `pip install --no-deps -e .` first):
#   bash tools/probes/tp_linear_gpu.sh [check] [bench] [conformance]
# Parts (arguments, default all, in this order): check bench conformance. The conformance
# matrix runs last with whatever is left of BUDGET_S (570 s); if it is cut off, a second
# call with the argument `conformance` finishes it. Files under $RESULTS (default
# ./tp-linear-results): the log,
# tp_check.jsonl, conformance-tp-cuda.log, and per transport <transport>/<device>/tp_linear.json
# with <transport>/<device>.md.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
RESULTS="${RESULTS:-$PWD/tp-linear-results}"
mkdir -p "$RESULTS"
LOG="$RESULTS/tp_linear_gpu.log"
say() { echo "== $(date +%T) $*" | tee -a "$LOG"; }

python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || say "pip install -e . failed"
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>>"$LOG" || echo 0)
say "$(nvidia-smi -L 2>&1 | tr '\n' ' ')— torch $(python3 -c 'import torch; print(torch.__version__)') sees $GPUS GPU(s)"
[ "$GPUS" -ge 1 ] || { say "no GPU: nothing to do"; exit 2; }

check() {  # world backend device [--stage-host]
  say "tp_check world=$1 backend=$2 device=$3 ${4:-}"
  timeout 150 python3 -m quantcore.conformance.tp.processes --world "$1" --backend "$2" --device "$3" \
      --hidden 2048 --inter 5632 --m 16 ${4:-} 2>>"$LOG" | tee -a "$RESULTS/tp_check.jsonl"
  local rc=${PIPESTATUS[0]}
  say "tp_check rc=$rc"
  return "$rc"
}

bench() {  # label, then VAR=value settings for the suite
  local label=$1
  shift
  say "bench tp_linear ($label)"
  env "$@" timeout 150 python3 -m quantcore bench tp_linear --device cuda --out "$RESULTS/$label" \
      --shape M=1,K=4096,N=11008,W=1 --shape M=16,K=4096,N=11008,W=1 --shape M=128,K=4096,N=11008,W=1 \
      --shape M=1,K=4096,N=11008,W=2 --shape M=16,K=4096,N=11008,W=2 --shape M=128,K=4096,N=11008,W=2 \
      2>&1 | tail -22 | tee -a "$LOG"
}

PARTS="${*:-check bench conformance}"
STAGE=()
if [[ " $PARTS " == *" check "* ]]; then
  check 1 gloo cuda
  if ! check 2 gloo cuda; then
    say "gloo on CUDA tensors failed: again with the all-reduce staged through the host"
    check 2 gloo cuda --stage-host && STAGE=(QUANTCORE_TP_STAGE_HOST=1)
  fi
  [ "$GPUS" -ge 2 ] && check 2 nccl cuda:rank
fi
if [[ " $PARTS " == *" bench "* ]]; then
  bench gloo-one-gpu QUANTCORE_TP_BACKEND=gloo QUANTCORE_TP_DEVICE=cuda "${STAGE[@]}"
  [ "$GPUS" -ge 2 ] && bench nccl-two-gpus QUANTCORE_TP_BACKEND=nccl QUANTCORE_TP_DEVICE=cuda:rank
fi
if [[ " $PARTS " == *" conformance "* ]]; then
  # Last, with what is left of the ~9.5 minutes: one line per cell, so a cut-off run still says what ran.
  LEFT=$(( ${BUDGET_S:-570} - SECONDS ))
  if [ "$LEFT" -gt 30 ]; then
    say "tensor-parallel conformance matrix on cuda (profile ci), ${LEFT}s left"
    timeout "$LEFT" python3 -m pytest conformance/test_tp.py --qc-device cuda -v -n 0 -p no:cacheprovider \
        --tb=line -rfs >"$RESULTS/conformance-tp-cuda.log" 2>&1
    say "conformance rc=$? — $(tail -1 "$RESULTS/conformance-tp-cuda.log")"
  else
    say "no time left for the conformance matrix: run this script again with the argument conformance"
  fi
fi
say "done"
