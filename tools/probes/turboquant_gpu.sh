#!/usr/bin/env bash
# Does TurboQuant hold on a CUDA machine, in one go: doctor, the TurboQuant conformance matrix
# (full profile, all three backends), the CUDA-only tests, and the two benchmark suites.
#   bash tools/probes/turboquant_gpu.sh [conformance|bench|all]   (results under $RESULTS,
#   default ./turboquant-results)
set -uo pipefail
RESULTS=${RESULTS:-$PWD/turboquant-results}
mkdir -p "$RESULTS"
part=${1:-all}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m quantcore doctor --device cuda
if [[ $part == conformance || $part == all ]]; then
  timeout "${CONFORMANCE_S:-200}" python3 -m pytest -q -n 8 --dist loadgroup -p no:cacheprovider conformance \
    --qc-device cuda --qc-profile full --qc-format turboquant > "$RESULTS/conformance.log" 2>&1
  grep -v "^FAILED" "$RESULTS/conformance.log" | tail -25; grep "^FAILED" "$RESULTS/conformance.log" | cut -c1-300 | head -12
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/turboquant/test_cuda.py 2>&1 | tail -5
fi
if [[ $part == bench || $part == all ]]; then
  timeout "${LINEAR_S:-300}" python3 -m quantcore bench turboquant_linear --device cuda --graph --out "$RESULTS" --rounds 3
  timeout "${OFFLOAD_S:-120}" python3 -m quantcore bench turboquant_offload --device cuda --out "$RESULTS" --rounds 3
fi
