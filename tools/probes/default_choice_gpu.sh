#!/usr/bin/env bash
# Does get_kernel's default hold on a CUDA machine: measure every kernel over a suite's bench grid (quantcore tune,
# CUDA graphs), merge the times into the shipped table quantcore/tables/<device>.json, then
# rerun the suite with a fresh cache so that get_kernel's default comes from that shipped
# table; the results mark the default (chosen: true, ★) and check it is within 1.15× of the
# fastest kernel that keeps the weight compressed. One part per call (each < 10 min):
#   bash tools/probes/default_choice_gpu.sh gptq|awq|turboquant|moe_svdquant
# Writes under $RESULTS (default ./default-choice-results): tables/<device>.json (the merged table: copy it over the tree's before
# the next part), results/<device>/<suite>.json and results/<device>.md, tune-<part>.json.
set -uo pipefail
RESULTS=${RESULTS:-$PWD/default-choice-results}
part=${1:?part: gptq, awq, turboquant or moe_svdquant}
mkdir -p "$RESULTS/tables" "$RESULTS/results"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} PYTHONUNBUFFERED=1
case $part in
  gptq) suites=gptq_linear; shapes=default,sweep,prefill ;;
  awq) suites=awq_linear; shapes=default,sweep,prefill ;;
  turboquant) suites=turboquant_linear; shapes=default,sweep ;;
  moe_svdquant) suites=trtllm_moe,svdquant_prequant; shapes=default ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
device=$(python3 -c "from quantcore.probe import probe; from quantcore.measured import device_slug; print(device_slug(probe('cuda').name))")
table=quantcore/tables/$device.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
# 1. Measure (a scratch cache: nothing from an earlier run is reused) and merge into the shipped table.
QUANTCORE_CACHE=$(mktemp -d) timeout "${TUNE_S:-330}" python3 -m quantcore tune --suite "$suites" --shapes "$shapes" \
  --device cuda --graph --fresh --export "$table" --json "$RESULTS/tune-$part.json" || echo "tune exited $?"
cp "$table" "$RESULTS/tables/"
# 2. The suites again with an empty cache: the default choice is the shipped table's.
export QUANTCORE_CACHE=$(mktemp -d)
for suite in ${suites//,/ }; do
  timeout "${BENCH_S:-200}" python3 -m quantcore bench "$suite" --device cuda --graph --shapes "$shapes" --rounds 5 --save \
    --plot "benchmarks/results/plots/cuda-$suite.png" > "$RESULTS/bench-$suite.log" 2>&1 || echo "bench $suite exited $?"
  cp "benchmarks/results/$device/$suite.json" "$RESULTS/results/" 2>/dev/null
  cp "benchmarks/results/plots/cuda-$suite.png" "$RESULTS/results/" 2>/dev/null  # svdquant_prequant: one M, a plot of dots
  grep -E "default .*fastest compressed|not timed|nothing that keeps" "$RESULTS/bench-$suite.log" | sed "s/^ */$suite: /"
done
cp "benchmarks/results/$device.md" "$RESULTS/results/" 2>/dev/null
grep -c MISSED "$RESULTS"/bench-*.log
