#!/usr/bin/env bash
# A batch of GPU runs under one call, each under its own timeout, everything packed into
# one archive (the device hands back few files): $OUT/runs.tgz, and each run's last lines
# on stdout.
#
#   bash tools/probes/batch_gpu.sh tables overhead svdquant decode16 cluster
#
#   tables     the TurboQuant table entries of this card in bf16 and fp16 against the golden
#   tqcuda     the same, and the TurboQuant CUDA tests of the tensor-core rotations and the
#              decode kernel's paired lookups (CUDA graphs recorded after eager calls)
#   hostprofile where an eager call's host time goes (tools/probes/call_host_profile.py):
#              TurboQuant and GPTQ-4, kernels and modules, beside nn.Linear
#   overhead   quantcore bench overhead (host µs per eager call and CUDA-graph replays)
#   svdquant   quantcore bench svdquant_prequant --graph
#   decode16   model_decode B = 16, bf16 and TurboQuant-4 fused (tools/probes/model_decode_gpu.sh)
#   cluster    the split-K sum through a thread-block cluster against the ticket sum (cluster_sum.py)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/batch-runs}"
WORK=$(mktemp -d)/runs
mkdir -p "$WORK" "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$WORK/device.txt"

# step NAME LIMIT_S COMMAND...: one run, its output in NAME.log, its tail printed.
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $(date +%T) $name (timeout ${limit}s)"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  echo "== $name rc=$?"
  tail -n 12 "$WORK/$name.log" | cut -c1-300
  # packed after every run, so a batch stopped at the call's limit still hands back what ran
  tar czf "$OUT/runs.tgz" -C "$(dirname "$WORK")" runs
}

for part in "$@"; do
  case $part in
  tables) step tables 200 python3 -m pytest tests/turboquant/test_cuda_tables.py -q -n 0 -p no:cacheprovider -rf ;;
  tqcuda) step tqcuda 330 python3 -m pytest tests/turboquant/test_cuda_tables.py tests/turboquant/test_cuda_mma_rotation.py \
      tests/turboquant/test_cuda_gemv_pairs.py -q -n 0 -p no:cacheprovider -rf ;;
  hostprofile) step hostprofile 150 python3 -m tools.probes.call_host_profile --ms 1,16,128,1024 \
      --names 'turboquant_triton|TurboQuantLinear|hopper_wgmma|QuantLinear|nn.Linear' --json "$WORK/call_host_profile.json" ;;
  overhead) step overhead 170 python3 -m quantcore bench overhead --device cuda --shapes default --rounds 5 \
      --out "$WORK/overhead" ;;
  svdquant) step svdquant 200 python3 -m quantcore bench svdquant_prequant --device cuda --graph --rounds 3 \
      --out "$WORK/svdquant" ;;
  decode16) step decode16 260 env VARIANTS=bf16,tq4-g128-fused LIMIT_S=240 RESULTS="$WORK/decode16" \
      bash tools/probes/model_decode_gpu.sh b16 ;;
  cluster)
    step cluster_sum 120 python3 -m tools.probes.cluster_sum --json "$WORK/cluster_sum.json" ;;
  *) echo "unknown part: $part" ;;
  esac
done
