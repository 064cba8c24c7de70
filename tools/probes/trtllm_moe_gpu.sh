#!/usr/bin/env bash
# Does trtllm_moe_triton hold on a CUDA machine, which tiles are fastest, and how fast is it
# against cuBLAS: in one call (repository root, quantcore installed -e):
#
#   RESULTS=DIR bash tools/probes/trtllm_moe_gpu.sh
#
# 1. correctness on CUDA (conformance full profile for trtllm_moe_triton, tests/trtllm_moe,
#    the kernel fuzz), beside the sweep's compile phase — CPU-heavy, light on the GPU;
# 2. the tile sweep (tools/probes/trtllm_moe_tiles.py): every tile checked, then timed once nothing else runs;
#    writes the tuned table tiles.json;
# 3. quantcore bench trtllm_moe (CUDA graphs) with that table: the committed results;
# 4. ncu on the T = 4096 kernel. Everything is packed into DIR/results.tgz (the logs of
#    the sweep and the bench also sit beside it).
set -uo pipefail
RESULTS=${RESULTS:-trtllm_moe-results}
W=$(mktemp -d)
mkdir -p "$RESULTS"
# A device machine starts bare: quantcore from this checkout (its package map needs the install).
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$RESULTS/install.log" 2>&1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$W/gpu.txt"
py=python3
(timeout "${BG_S:-100}" $py -m pytest -q -n 6 --dist loadgroup -p no:cacheprovider conformance --qc-device cuda \
  --qc-profile full --qc-format trtllm_moe --qc-backend trtllm_moe_triton > "$W/conformance.log" 2>&1
 echo "rc=$?" >> "$W/conformance.log") &
c=$!
(timeout "${BG_S:-100}" $py -m pytest -q -n 2 -p no:cacheprovider tests/trtllm_moe --qc-device cuda -rs \
  > "$W/tests.log" 2>&1; echo "rc=$?" >> "$W/tests.log") &
t=$!
(QUANTCORE_FUZZ_DEVICE=cuda timeout "${BG_S:-100}" $py -m pytest -q -n 2 -p no:cacheprovider \
  tests/hardening/test_fuzz_kernels.py -k moe --qc-device cuda > "$W/fuzz.log" 2>&1; echo "rc=$?" >> "$W/fuzz.log") &
f=$!
(while kill -0 $c 2>/dev/null || kill -0 $t 2>/dev/null || kill -0 $f 2>/dev/null; do sleep 1; done) &
timeout "${SWEEP_S:-170}" $py -m tools.probes.trtllm_moe_tiles --out "$W" --jobs 6 --wait-pid $! 2>&1 \
  | tee "$W/sweep.log"
wait
if [[ -f "$W/tiles.json" ]]; then export QUANTCORE_TRTLLM_MOE_TILES="$W/tiles.json"; fi
timeout "${BENCH_S:-70}" $py -m quantcore bench trtllm_moe --device cuda --graph --out "$W/bench" \
  --plot "$W/bench/trtllm_moe.png" 2>&1 | tee "$W/bench.log" | grep -v "^\["
timeout "${NCU_S:-25}" ncu --kernel-name regex:moe_w8a16 --launch-skip 2 --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis \
  $py -m tools.probes.trtllm_moe_tiles --profile 4096 > "$W/ncu4096.txt" 2>&1
tar -czf "$RESULTS/results.tgz" -C "$W" .
cp "$W/sweep.log" "$W/bench.log" "$RESULTS/" 2>/dev/null
for log in conformance tests fuzz; do echo "== $log"; tail -n 4 "$W/$log.log"; done
grep -E "Duration|Compute \(SM\)|Issued Warp|No Eligible" "$W/ncu4096.txt"
