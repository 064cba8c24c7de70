#!/usr/bin/env bash
# hopper_wgmma on an sm_90 machine; every output lands in OUTDIR/results.tgz (after each
# step, so a call cut short keeps what was done), the merged JSON files also beside it
# (a device call returns only a few files):
#   bash tools/probes/hopper_wgmma_gpu.sh OUTDIR STEP ...
# check: tools/probes/hopper_wgmma_sweep.py's check in one process;
# prep[:BITS[:MS]]: the check in CHECK_SHARDS processes (each cell REPEAT times) side by
#   side with WARM_SHARDS processes compiling what timeBITS will run, then the check merged;
# timeBITS[:M,..[:DTYPE,..]]: the timings (PEERS: the peers timed besides hopper_wgmma);
# bench:SUITE: that suite's "hopper" shapes, every kernel and cuBLAS in one run (CUDA
#   graphs, 3 rounds); ncu:M,K,N: the profile of tools/probes/hopper_wgmma_ncu.py's launch;
# table: the timings so far written as this card's tuned table into backends/hopper_wgmma
#   (so the steps and commands after it run with the new plans) and into OUTDIR.
# SHAPES=KxN,... times and compiles those weight shapes instead of the sweep's default ones;
# FOCUS=late checks and times the late-scale plans only (beside the plan a call takes).
set -uo pipefail
dest=$1; shift
mkdir -p "$dest"
out=$(mktemp -d)
keep() {
  tar -czf "$dest/results.tgz" -C "$out" .
  cp "$out"/check.json "$out"/time-*.json "$out"/device.json "$dest"/ 2> /dev/null || true
}
trap keep EXIT
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
if ! python3 -c "import quantcore.backends.hopper_wgmma" 2> /dev/null; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1
fi
if ! python3 -c "import quantcore.backends.hopper_wgmma" 2> /dev/null; then
  echo "editable install failed (install.log): running from a copy, without entry points"
  site=$(mktemp -d); cp -r quantcore "$site/"
  for d in backends benchmarks conformance; do cp -r "$d" "$site/quantcore/$d"; done
  export PYTHONPATH="$site"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
sweep="python3 -m tools.probes.hopper_wgmma_sweep --out $out ${FOCUS:+--focus $FOCUS}"
for step in "$@"; do
  t0=$SECONDS
  case $step in
    check) timeout "${CHECK_S:-170}" $sweep --only check --repeat "${REPEAT:-1}" > "$out/check.log" 2>&1
           grep -v "^FAIL" "$out/check.log" | tail -3; grep "^FAIL" "$out/check.log" | cut -c1-400 | head -15 ;;
    prep*) IFS=: read -r _ bits ms <<< "$step"
           pids=(); gpus=$(nvidia-smi -L 2> /dev/null | wc -l); ((gpus > 0)) || gpus=1  # spread over the GPUs
           for ((i = 0; i < ${CHECK_SHARDS:-8}; i++)); do
             CUDA_VISIBLE_DEVICES=$((i % gpus)) timeout "${PREP_S:-170}" $sweep --only check \
               --shard "$i/${CHECK_SHARDS:-8}" --repeat "${REPEAT:-2}" > "$out/check-$i.log" 2>&1 & pids+=($!)
           done
           for ((i = 0; i < ${WARM_SHARDS:-6}; i++)); do
             CUDA_VISIBLE_DEVICES=$(((i + 1) % gpus)) timeout "${PREP_S:-170}" $sweep --only warm \
               --shard "$i/${WARM_SHARDS:-6}" --bits "${bits:-4}" ${ms:+--ms "$ms"} ${SHAPES:+--shapes "$SHAPES"} > "$out/warm-$i.log" 2>&1 & pids+=($!)
           done
           wait "${pids[@]}"
           tail -qn1 "$out"/check-*.log "$out"/warm-*.log
           cat "$out"/check-*.log | grep "^FAIL" | cut -c1-400 | head -15
           $sweep --only merge ;;
    bench:*) suite=${step#bench:}
           timeout "${BENCH_S:-240}" python3 -m quantcore bench "$suite" --device cuda --shapes hopper --graph --rounds 3 \
             --out "$out" --plot "$out/$suite.png" > "$out/$suite.log" 2>&1
           grep -v "^\s*$" "$out/$suite.log" | grep -i "goal\|error\|wrote\|Traceback" | cut -c1-160 | tail -70 ;;
    time*) # timeBITS[:M,M,...[:DTYPE,...]]
           IFS=: read -r spec ms dtypes <<< "${step#time}"
           timeout "${TIME_S:-330}" $sweep --only time --bits "$spec" ${ms:+--ms "$ms"} ${dtypes:+--dtypes "$dtypes"} \
             ${SHAPES:+--shapes "$SHAPES"} --peers "${PEERS:-cublas,triton_int4,aten_cuda}" 2>&1 | grep -v -i warn \
             | tee "$out/time-$spec${dtypes:+-$dtypes}.log" | cut -c1-230 ;;
    ncu:*) # ncu:M,K,N
           IFS=, read -r m k n <<< "${step#ncu:}"
           timeout "${NCU_S:-150}" ncu --clock-control none -k regex:wgmma --launch-skip 1 --launch-count 1 \
             --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
             --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
             python3 -m tools.probes.hopper_wgmma_ncu "$m" "$k" "$n" > "$out/ncu-M$m-K$k-N$n.txt" 2>&1
           grep -E "Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Registers Per|Block Limit|Issue Slots|Busy|Stall" \
             "$out/ncu-M$m-K$k-N$n.txt" | head -40 ;;
    table) python3 -m tools.probes.hopper_wgmma_sweep --table "$out"/device.json "$out"/time-*.json $(ls "$out"/check.json 2> /dev/null) \
             --out backends/hopper_wgmma 2>&1 | tee "$out/table.log" | tail -30
           cp backends/hopper_wgmma/tuned-*.json "$out"/ ;;
    *) echo "unknown step $step" ;;
  esac
  echo "[$step: $((SECONDS - t0))s]"
  keep
done
