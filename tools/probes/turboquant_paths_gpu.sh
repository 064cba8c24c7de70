#!/usr/bin/env bash
# How near the bandwidth limit is each TurboQuant path, on a CUDA GPU: one part per call,
# each within ten minutes. From the repository root, quantcore installed with
# `pip install --no-deps -e .`; the cutile part needs cuTile installed (docs/cutile.md).
#
#   bash tools/probes/turboquant_paths_gpu.sh paths|large|tune|correct|cutile|bench
#
#   paths    the decode GEMV and the M = 16 paths with every configuration, ncu of the decode kernel
#   large    the M = 128 and M = 2048 paths; the offload host probe; the CUDA-only tests
#   tune     the best configuration per shape (the shipped table's source); the offload host probe
#   correct  the TurboQuant cells of the matrix (full profile) and the CUDA kernel fuzz; the offload suite
#   cutile   every kernel, cuTile against Triton, timed in one run as CUDA-graph replays
#   bench    the turboquant_linear suite as CUDA-graph replays (every registered kernel)
#
# Results and logs go to $RESULTS (default ./turboquant-paths-results).
set -uo pipefail
RESULTS=${RESULTS:-$PWD/turboquant-paths-results}
mkdir -p "$RESULTS"
part=${1:?part: paths, large, tune, correct, cutile or bench}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
paths() {  # paths PART SECONDS [LINES]
  timeout "$2" python3 -m tools.probes.turboquant_paths --part "$1" --json "$RESULTS/paths-$1.json" \
    > "$RESULTS/paths-$1.log" 2>&1
  grep -v "^  done" "$RESULTS/paths-$1.log" | tail -"${3:-40}"
}
ncu_gemv() {
  timeout 45 ncu --clock-control none --set full -k regex:gemv_kernel -s 3 -c 1 \
    python3 -m tools.probes.turboquant_ncu_target --path gemv > "$RESULTS/ncu-gemv.txt" 2>&1
  grep -E "^\s+(Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|No Eligible|Executed Instructions  )" "$RESULTS/ncu-gemv.txt" | head -10
}
offload_host() {
  timeout 50 python3 -m tools.probes.turboquant_offload_host > "$RESULTS/offload-host.txt" 2>&1
  cat "$RESULTS/offload-host.txt"
}
case $part in
paths)
  paths decode 110 45; ncu_gemv; paths mid16 110 40
  ;;
large)
  paths mid128 80 25; paths prefill 90 25
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/turboquant/test_cuda.py 2>&1 | tail -3
  offload_host
  ;;
tune)
  timeout 185 python3 -m tools.probes.turboquant_tune --out "$RESULTS/tuned.json" > "$RESULTS/tune.log" 2>&1
  grep -E "^  (gemv|mma|crossover)" "$RESULTS/tune.log"; tail -3 "$RESULTS/tune.log" | cut -c1-300
  offload_host
  ;;
correct)
  timeout 200 python3 -m quantcore conformance --device cuda --profile full --group family --format turboquant \
    --json "$RESULTS/conformance-cuda-turboquant.json" > "$RESULTS/conformance.log" 2>&1; tail -30 "$RESULTS/conformance.log"
  QUANTCORE_FUZZ_DEVICE=cuda timeout 90 python3 -m pytest -q -n 6 -p no:cacheprovider tests/hardening/test_fuzz_kernels.py \
    --qc-device cuda > "$RESULTS/fuzz-cuda.log" 2>&1; tail -5 "$RESULTS/fuzz-cuda.log"
  timeout 60 python3 -m quantcore bench turboquant_offload --device cuda --out "$RESULTS" --rounds 3 2>&1 | tail -8
  ;;
cutile)
  python3 -m quantcore explain turboquant cuda -M 1 -K 4096 -N 14336 2>&1 | tail -6
  timeout 255 python3 -m quantcore bench turboquant_linear --device cuda --graph --rounds 3 --out "$RESULTS" \
    --plot "$RESULTS/cuda-turboquant_linear.png" > "$RESULTS/bench-linear.log" 2>&1; tail -45 "$RESULTS/bench-linear.log"
  ;;
bench)
  timeout 250 python3 -m quantcore bench turboquant_linear --device cuda --graph --rounds 5 --out "$RESULTS" \
    --plot "$RESULTS/cuda-turboquant_linear.png" 2>&1 | tail -60
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
