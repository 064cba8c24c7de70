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
case $part in
a)
  timeout 130 python3 -m quantcore.benchmarks.turboquant_paths --part decode --json "$OUT/paths-decode.json" > "$OUT/paths-decode.log" 2>&1
  grep -v "^  done" "$OUT/paths-decode.log" | tail -48
  timeout 45 ncu --clock-control none --set full -k regex:gemv_kernel -s 3 -c 1 \
    python3 -m quantcore.benchmarks.turboquant_ncu_target --path gemv > "$OUT/ncu-gemv.txt" 2>&1
  grep -E "^\s+(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active|No Eligible|Warp Cycles Per Issued)" "$OUT/ncu-gemv.txt" | head -14
  timeout 95 python3 -m quantcore.benchmarks.turboquant_paths --part mid --json "$OUT/paths-mid.json" > "$OUT/paths-mid.log" 2>&1
  grep -v "^  done" "$OUT/paths-mid.log" | tail -45
  ;;
b)
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/turboquant/test_cuda.py 2>&1 | tail -3
  timeout 120 python3 -m quantcore.benchmarks.turboquant_paths --part prefill --json "$OUT/paths-prefill.json" > "$OUT/paths-prefill.log" 2>&1
  grep -v "^  done" "$OUT/paths-prefill.log" | tail -25
  timeout 60 python3 -m quantcore.benchmarks.turboquant_offload_host > "$OUT/offload-host.txt" 2>&1; cat "$OUT/offload-host.txt"
  timeout 60 python3 -m quantcore bench turboquant_offload --device cuda --out "$OUT" --rounds 3 2>&1 | tail -12
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
