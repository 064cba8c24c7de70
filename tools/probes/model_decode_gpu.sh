#!/usr/bin/env bash
# How fast does a quantized Llama-3.1-8B-shaped model generate, fused and unfused, against bf16
# and tinygemm, and how close are its logits to the float reference: the model_decode suite on
# a CUDA machine, one shape set per call (each sized to finish within nine minutes on an H100),
# results and logs under $RESULTS (default: $OUT, else ./model-decode-results):
#
#   bash tools/probes/model_decode_gpu.sh SET [bench|profile]
#   bash tools/probes/model_decode_gpu.sh check
#
#   SET      b1 | b16 | b64 | prefill | eager | layers8   (benchmarks/suites/model_decode.py)
#   bench    (default) tokens/s or time to first token, x bf16, x tinygemm, share of copy BW and
#            the logits' error against the float reference; b1/b16/b64/prefill replay CUDA graphs
#            (--graph), eager does not (the host's launch cost is what it measures)
#   profile  where a step's time goes: linears, attention, norms, LM head, gaps
#            (python -m quantcore.benchmarks.decode_profile; TRACE=1 also writes chrome traces)
#   check    fused projections on the GPU's kernels: fused vs unfused vs the float reference,
#            inductor and a CUDA-graph replay (tests/nn/test_fuse_cuda.py), a minute or two
#
# Environment: VARIANTS=bf16,gptq4-g128-fused,...  run only these (default: bf16, gptq4-g128,
# gptq4-g128-fused, tq4-g128-fused, tinygemm; each costs one torch.compile of the 32-layer model,
# about a minute — split a set over two calls with VARIANTS if one runs long);
# ROUNDS (3), STEPS (8, profile), LIMIT_S (530: the command's own time limit).
set -uo pipefail
RESULTS=${RESULTS:-${OUT:-$PWD/model-decode-results}}
set_name=${1:?usage: model_decode_gpu.sh b1|b16|b64|prefill|eager|layers8 [bench|profile], or check}
part=${2:-bench}
if [[ $set_name == check ]]; then
  part=check
fi
mkdir -p "$RESULTS"
# A device machine starts bare: quantcore from this checkout (its package map needs the install).
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$RESULTS/install.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
if [[ -n ${VARIANTS:-} ]]; then
  export QUANTCORE_DECODE_VARIANTS=$VARIANTS
fi
graph=--graph
if [[ $set_name == eager ]]; then
  graph=
fi
start=$(date +%s)
case $part in
  bench)
    timeout "${LIMIT_S:-530}" python3 -m quantcore bench model_decode --device cuda --shapes "$set_name" $graph \
      --rounds "${ROUNDS:-3}" --out "$RESULTS/results" --json "$RESULTS/model_decode-$set_name.json" \
      > "$RESULTS/model_decode-$set_name.log" 2>&1
    status=$?
    grep -v "^\[" "$RESULTS/model_decode-$set_name.log" | tail -40
    ;;
  profile)
    timeout "${LIMIT_S:-530}" python3 -m quantcore.benchmarks.decode_profile --device cuda \
      --shapes "$set_name" --steps "${STEPS:-8}" --out "$RESULTS/profile" ${TRACE:+--trace} \
      > "$RESULTS/profile-$set_name.log" 2>&1
    status=$?
    tail -40 "$RESULTS/profile-$set_name.log"
    ;;
  check)
    timeout "${LIMIT_S:-530}" python3 -m pytest -q -rA -s -p no:cacheprovider tests/nn/test_fuse_cuda.py \
      > "$RESULTS/fuse_cuda.log" 2>&1
    status=$?
    grep -E "fused on|^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|Error" "$RESULTS/fuse_cuda.log" | cut -c1-220 | tail -40
    ;;
  *)
    echo "part: expected bench, profile or check, got $part" >&2
    exit 2
    ;;
esac
echo "model_decode $set_name $part: exit $status after $(( $(date +%s) - start )) s"
exit $status
