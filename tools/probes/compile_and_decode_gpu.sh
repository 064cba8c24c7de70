#!/usr/bin/env bash
# Do the CUDA kernels compile, capture and export as custom ops, and how fast does a model
# decode with them: on a CUDA machine, in one go (results and logs under $RESULTS, default
# ./compile-and-decode-results):
#   tests  every CUDA kernel as a custom op: opcheck, compile fullgraph, reduce-overhead
#          (CUDA graphs), torch.export, each bit-equal to the direct call; modules moving
#          between devices (tests/cuda/test_compile_cuda.py)
#   decode the model_decode suite (Llama-3.1-8B layer shapes, bf16 vs GPTQ-4 vs TurboQuant-4,
#          B = 1 and 16, 128 tokens, torch.compile + CUDA graphs); SHAPES=layers8 for 8 layers
#   bash tools/probes/compile_and_decode_gpu.sh [tests|decode|all]
set -uo pipefail
RESULTS=${RESULTS:-$PWD/compile-and-decode-results}
mkdir -p "$RESULTS"
part=${1:-all}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
if [[ $part == tests || $part == all ]]; then
  xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4" || echo "")
  timeout "${TESTS_S:-240}" python3 -m pytest -q -rA $xdist -p no:cacheprovider --qc-device cuda tests/cuda/test_compile_cuda.py \
    > "$RESULTS/compile_cuda.log" 2>&1
  grep -E "^(PASSED|FAILED|XFAIL|XPASS|ERROR|SKIPPED)|passed|failed" "$RESULTS/compile_cuda.log" | cut -c1-220 | tail -80
fi
if [[ $part == decode || $part == all ]]; then
  timeout "${DECODE_S:-560}" python3 -m quantcore bench model_decode --device cuda --shapes "${SHAPES:-default}" --graph \
    --rounds "${ROUNDS:-3}" --out "$RESULTS/results" 2>&1 | tee "$RESULTS/model_decode.log" | tail -30
fi
