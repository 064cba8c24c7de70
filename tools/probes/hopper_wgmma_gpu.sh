#!/usr/bin/env bash
# hopper_wgmma on an sm_90 machine, the steps named after the output folder (everything
# lands in OUTDIR/results.tgz):
#   bash tools/probes/hopper_wgmma_gpu.sh OUTDIR check time4[:M,..[:bf16,fp16]] bench:SUITE ...
# check / timeN: tools/probes/hopper_wgmma_sweep.py; bench:SUITE: that suite's
# "hopper" shapes, every kernel and cuBLAS in one run (CUDA graphs, 3 rounds); ncu:M,K,N:
# the profile of tools/probes/hopper_wgmma_ncu.py's launch.
set -uo pipefail
dest=$1; shift
out=$(mktemp -d)
trap 'tar -czf "$dest/results.tgz" -C "$out" .' EXIT
mkdir -p "$dest"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1; then
  echo "editable install failed (install.log): running from a copy, without entry points"
  site=$(mktemp -d); cp -r quantcore "$site/"
  for d in backends benchmarks conformance; do cp -r "$d" "$site/quantcore/$d"; done
  export PYTHONPATH="$site"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
for step in "$@"; do
  case $step in
    check) timeout "${CHECK_S:-170}" python3 -m tools.probes.hopper_wgmma_sweep --out "$out" --only check \
             > "$out/check.log" 2>&1; grep -v "^FAIL" "$out/check.log" | tail -3; grep "^FAIL" "$out/check.log" | cut -c1-400 | head -15 ;;
    bench:*) suite=${step#bench:}
           timeout "${BENCH_S:-240}" python3 -m quantcore bench "$suite" --device cuda --shapes hopper --graph --rounds 3 \
             --out "$out" --plot "$out/$suite.png" > "$out/$suite.log" 2>&1
           grep -v "^\s*$" "$out/$suite.log" | grep -i "goal\|error\|wrote\|Traceback" | cut -c1-160 | tail -70 ;;
    time*) # timeBITS[:M,M,...[:DTYPE,...]]
           IFS=: read -r spec ms dtypes <<< "${step#time}"
           timeout "${TIME_S:-330}" python3 -m tools.probes.hopper_wgmma_sweep --out "$out" --only time \
             --bits "$spec" ${ms:+--ms "$ms"} ${dtypes:+--dtypes "$dtypes"} 2>&1 | grep -v -i warn \
             | tee "$out/time-$spec${dtypes:+-$dtypes}.log" ;;
    ncu:*) # ncu:M,K,N
           IFS=, read -r m k n <<< "${step#ncu:}"
           timeout "${NCU_S:-150}" ncu --clock-control none -k regex:wgmma --launch-skip 1 --launch-count 1 \
             --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
             --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
             python3 -m tools.probes.hopper_wgmma_ncu "$m" "$k" "$n" > "$out/ncu-M$m-K$k-N$n.txt" 2>&1
           grep -E "Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Registers Per|Block Limit|Issue Slots|Busy|Stall" \
             "$out/ncu-M$m-K$k-N$n.txt" | head -40 ;;
    *) echo "unknown step $step" ;;
  esac
  tar -czf "$dest/results.tgz" -C "$out" .  # what is done so far comes back even if a later step is cut
done
