#!/usr/bin/env bash
# Programmatic dependent launch in hopper_wgmma (docs/pdl.md) on one Hopper GPU, about
# eight minutes: Llama-3.1-8B's decode at B = 1 (CUDA graphs) with each mode, the bf16 model
# and the GPTQ-4 fused one with PDL off first, then the fused one with `wait` and with
# `prefetch` (each reports its logits' error against the float reference), then the
# kernel's CUDA tests with `prefetch`. Results under $RESULTS (default $OUT, else ./pdl-results).
#
#   bash tools/probes/pdl_gpu.sh
set -uo pipefail
RESULTS=${RESULTS:-${OUT:-$PWD/pdl-results}}
mkdir -p "$RESULTS"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$RESULTS/install.log" 2>&1
run() {  # run NAME MODE VARIANTS LIMIT_S
  QUANTCORE_HOPPER_PDL=$2 VARIANTS=$3 LIMIT_S=$4 RESULTS="$RESULTS/$1" \
    bash tools/probes/model_decode_gpu.sh b1 > "$RESULTS/$1.out" 2>&1
  grep -E "tok/s|exit" "$RESULTS/$1.out" | cut -c1-300
}
run off off bf16,gptq4-g128-fused 200
run wait wait gptq4-g128-fused 110
run prefetch prefetch gptq4-g128-fused 110
QUANTCORE_HOPPER_PDL=prefetch timeout 90 python3 -m pytest -q -p no:cacheprovider tests/hopper_wgmma \
  > "$RESULTS/tests-prefetch.log" 2>&1
tail -3 "$RESULTS/tests-prefetch.log"
