#!/usr/bin/env bash
# Issue 5 on a CUDA machine, in one go (from the repository root, torch and triton
# installed, quantcore installed with `pip install --no-deps -e .`):
#   bash benchmarks/svdquant_gpu.sh [conformance|tests|bench|all]
# conformance: the svdquant cells of the matrix, full profile, on cuda (log below)
# tests:       tests/svdquant on the GPU (CUDA-only bit-exactness, all 2^32 e4m3 patterns)
# bench:       quantcore bench svdquant_prequant, written to benchmarks/results/
set -uo pipefail
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
part=${1:-all}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m quantcore doctor --device cuda
slug=$(python3 -c "import torch, re; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))")
if [[ $part == conformance || $part == all ]]; then
  timeout "${CONFORMANCE_S:-900}" python3 -m pytest -q -n 8 --dist loadgroup -p no:cacheprovider conformance \
    --qc-device cuda --qc-profile full --qc-format svdquant 2>&1 | grep -v "^SKIPPED" > "$OUT/svdquant-$slug.conformance-full.log"
  tail -25 "$OUT/svdquant-$slug.conformance-full.log"
fi
if [[ $part == tests || $part == all ]]; then
  timeout "${TESTS_S:-600}" python3 -m pytest -q -p no:cacheprovider tests/svdquant --qc-device cuda -rs 2>&1 \
    | tee "$OUT/svdquant-$slug.tests.log" | tail -15
fi
if [[ $part == bench || $part == all ]]; then
  timeout "${BENCH_S:-600}" python3 -m quantcore bench svdquant_prequant --device cuda --out "$OUT"
fi
