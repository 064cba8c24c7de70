#!/usr/bin/env bash
# Does the SVDQuant pre-GEMM hold, and how fast is it, on a CUDA machine, in one go. From the repository root, with
# torch and triton installed and quantcore installed by `pip install --no-deps -e .`:
#
#   bash tools/probes/svdquant_gpu.sh [conformance|tests|bench|all]     (default: all)
#
# conformance  the svdquant cells of the matrix (triton_nvfp4, triton_ascend_int4,
#              svdquant_torch), full profile, on cuda
# tests        tests/svdquant on the GPU: bit-exactness at the format's target shapes and for every
#              tile, every float32 scale's e4m3 rounding against torch, CUDA-graph replay
# bench        quantcore bench svdquant_prequant: benchmarks/results/<device>/svdquant_prequant.json
#              and the regenerated benchmarks/results/<device>.md
# Logs of each part land in benchmarks/results/svdquant-<device>.*.log.
set -uo pipefail
RESULTS=${RESULTS:-benchmarks/results}
mkdir -p "$RESULTS"
part=${1:-all}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m quantcore doctor --device cuda
slug=$(python3 -c "import torch, re; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))")
status=0
if [[ $part == conformance || $part == all ]]; then
  timeout "${CONFORMANCE_S:-1200}" python3 -m pytest -q -n 8 --dist loadgroup -p no:cacheprovider conformance \
    --qc-device cuda --qc-profile full --qc-format svdquant > "$RESULTS/svdquant-$slug.conformance-full.log" 2>&1 || status=1
  grep -v "^SKIPPED" "$RESULTS/svdquant-$slug.conformance-full.log" | tail -15
fi
if [[ $part == tests || $part == all ]]; then
  timeout "${TESTS_S:-900}" python3 -m pytest -q -p no:cacheprovider tests/svdquant --qc-device cuda -rs \
    > "$RESULTS/svdquant-$slug.tests.log" 2>&1 || status=1
  tail -8 "$RESULTS/svdquant-$slug.tests.log"
fi
if [[ $part == bench || $part == all ]]; then
  timeout "${BENCH_S:-1200}" python3 -m quantcore bench svdquant_prequant --device cuda --out "$RESULTS" 2>&1 \
    | tee "$RESULTS/svdquant-$slug.bench.log" | grep -v "^\[" || status=1
fi
exit $status
