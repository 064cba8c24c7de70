#!/usr/bin/env bash
# Issue 17 on an H100, one part per device call (results under $OUT):
#   a: decode + middle-M paths with their configurations, ncu of the decode kernel
#   b: prefill paths, the offload host probe and suite, the CUDA-only tests
#   c: conformance (turboquant, full profile) and the CUDA kernel fuzz
#   d: the turboquant_linear suite as graph replays (every registered kernel, cuTile included)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
part=${1:-a}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
probe() {  # probe PART SECONDS
  timeout "$2" python3 -m quantcore.benchmarks.probes.turboquant_paths --part "$1" --json "$OUT/paths-$1.json" > "$OUT/paths-$1.log" 2>&1
  grep -v "^  done" "$OUT/paths-$1.log" | tail -"${3:-40}"
}
ncu_gemv() {
  timeout 45 ncu --clock-control none --set full -k regex:gemv_kernel -s 3 -c 1 \
    python3 -m quantcore.benchmarks.probes.turboquant_ncu_target --path gemv > "$OUT/ncu-gemv.txt" 2>&1
  grep -E "^\s+(Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|No Eligible|Executed Instructions  )" "$OUT/ncu-gemv.txt" | head -10
}
case $part in
a)  # decode and M = 16
  probe decode 110 45; ncu_gemv; probe mid16 110 40
  ;;
a2)  # decode, M = 16, 128, 2048 (one call)
  probe decode 75 37; ncu_gemv; probe mid16 55 22; probe mid128 45 20; probe prefill 55 18
  ;;
b)  # M = 128 and 2048, offload, CUDA-only tests
  probe mid128 80 25; probe prefill 90 25
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/turboquant/test_cuda.py 2>&1 | tail -3
  timeout 50 python3 -m quantcore.benchmarks.turboquant_offload_host > "$OUT/offload-host.txt" 2>&1; cat "$OUT/offload-host.txt"
  ;;
t1)  # cuTile wheels 1/3; tune the shipped configurations; the offload probe; CUDA-only tests
  mkdir -p /tmp/persist && cp ../../.whl1/* /tmp/persist/
  timeout 185 python3 -m quantcore.benchmarks.probes.turboquant_tune --out "$OUT/tuned.json" > "$OUT/tune.log" 2>&1
  grep -E "^  (gemv|mma|crossover)" "$OUT/tune.log"; tail -3 "$OUT/tune.log" | cut -c1-300
  timeout 50 python3 -m quantcore.benchmarks.turboquant_offload_host > "$OUT/offload-host.txt" 2>&1; cat "$OUT/offload-host.txt"
  timeout 40 python3 -m pytest -q -p no:cacheprovider tests/turboquant/test_cuda.py 2>&1 | tail -3
  ;;
t2)  # cuTile wheels 2/3; conformance and kernel fuzz on CUDA; the offload suite
  mkdir -p /tmp/persist && cp ../../.whl2/* /tmp/persist/
  timeout 150 python3 -m quantcore conformance --device cuda --profile full --group family --format turboquant \
    --json "$OUT/conformance-cuda-turboquant.json" > "$OUT/conformance.log" 2>&1; tail -22 "$OUT/conformance.log"
  QUANTCORE_FUZZ_DEVICE=cuda timeout 70 python3 -m pytest -q -n 6 -p no:cacheprovider tests/hardening/test_fuzz_kernels.py \
    --qc-device cuda > "$OUT/fuzz-cuda.log" 2>&1; tail -4 "$OUT/fuzz-cuda.log"
  timeout 60 python3 -m quantcore bench turboquant_offload --device cuda --out "$OUT" --rounds 3 2>&1 | tail -8
  ;;
t3)  # cuTile wheels 3/3, installed; every kernel timed in the same run (cuTile against Triton)
  cp ../../.whl3/* /tmp/persist/ && cd /tmp/persist && cat nvvm.part.a nvvm.part.b nvvm.part.c > "$(cat nvvm.name)" && cd - >/dev/null
  python3 -m pip install -q --no-deps --target /tmp/site /tmp/persist/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PATH=/tmp/site/nvidia/cu13/bin:$PATH
  python3 -m quantcore explain turboquant cuda -M 1 -K 4096 -N 14336 2>&1 | tail -6
  timeout 255 python3 -m quantcore bench turboquant_linear --device cuda --graph --rounds 3 --out "$OUT" \
    --plot "$OUT/cuda-turboquant_linear.png" > "$OUT/bench-linear.log" 2>&1; tail -45 "$OUT/bench-linear.log"
  ;;
c)
  timeout 200 python3 -m quantcore conformance --device cuda --profile full --group family --format turboquant \
    --json "$OUT/conformance-cuda-turboquant.json" > "$OUT/conformance.log" 2>&1; tail -30 "$OUT/conformance.log"
  QUANTCORE_FUZZ_DEVICE=cuda timeout 90 python3 -m pytest -q -n 6 -p no:cacheprovider tests/hardening/test_fuzz_kernels.py \
    --qc-device cuda > "$OUT/fuzz-cuda.log" 2>&1; tail -5 "$OUT/fuzz-cuda.log"
  ;;
d)
  timeout 250 python3 -m quantcore bench turboquant_linear --device cuda --graph --rounds 5 --out "$OUT" \
    --plot "$OUT/cuda-turboquant_linear.png" 2>&1 | tail -60
  ;;
esac
