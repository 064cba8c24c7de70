#!/usr/bin/env bash
# Programmatic dependent launch in hopper_wgmma (docs/pdl.md) on one Hopper GPU, about
# nine minutes a call: Llama-3.1-8B's decode at B = 1 (CUDA graphs), the bf16 model and the
# GPTQ-4 fused one in each mode named (every run times bf16 beside it, and reports its logits'
# error against the float reference; a run takes about 190 s), then the kernel's CUDA tests
# with `prefetch`. Results under $RESULTS (default $OUT, else ./pdl-results).
#
#   bash tools/probes/pdl_gpu.sh [MODE ...]     (default: off prefetch; then: wait)
set -uo pipefail
RESULTS=${RESULTS:-${OUT:-$PWD/pdl-results}}
mkdir -p "$RESULTS"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$RESULTS/install.log" 2>&1
run() {  # run NAME MODE VARIANTS LIMIT_S
  QUANTCORE_HOPPER_PDL=$2 VARIANTS=$3 LIMIT_S=$4 RESULTS="$RESULTS/$1" \
    bash tools/probes/model_decode_gpu.sh b1 > "$RESULTS/$1.out" 2>&1
  grep -E "tok/s|exit" "$RESULTS/$1.out" | cut -c1-300
}
for mode in "${@:-off prefetch}"; do
  for m in $mode; do
    run "$m" "$m" bf16,gptq4-g128-fused 210
  done
done
QUANTCORE_HOPPER_PDL=prefetch timeout 150 python3 -m pytest -q -rf -p no:cacheprovider tests/hopper_wgmma \
  > "$RESULTS/tests-prefetch.log" 2>&1
tail -3 "$RESULTS/tests-prefetch.log"
