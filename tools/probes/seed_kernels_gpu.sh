#!/usr/bin/env bash
# The seed kernels' GPU runs, one part per call, each within a few minutes (on an H200
# moe_hazard took 69 s with the install). From the repository root,
# installing quantcore from it (`pip install --no-deps -e .`); results and logs go to $RESULTS.
#
#   bash tools/probes/seed_kernels_gpu.sh moe_hazard|svdquant_tuned|turboquant_tune|offload_crossover|tables
#
#   moe_hazard         is the 256-row fp16 MoE tile's garbage the register-operand wgmma hazard: every
#                      tile pre- and post-scaled, SASS hazards beside wrong calls (≈ 3 min)
#   svdquant_tuned     the svdquant_prequant suite with its +tuned rows (CONFIGS, the small-batch tiles
#                      that fill the SMs included), NVFP4 then INT4, CUDA graphs (≈ 4 min each)
#   turboquant_tune    the TurboQuant table of this card, the decode variants (prerotate, register
#                      cap) timed beside the shipped configurations (≈ 4 min); on an H200 it is
#                      that card's first table
#   offload_crossover  where the pass-2 offload copy hides: the crossover shape set (≈ 3 min)
#   tables             the card-keyed tables on this card: which table each backend picks, and the
#                      turboquant_linear decode and M = 16 rows (≈ 2 min; on an H200 the H100 table)
set -uo pipefail
RESULTS=${RESULTS:-$PWD/seed-kernels-results}
mkdir -p "$RESULTS"
# A device machine starts bare: quantcore from this checkout (its package map needs the install).
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$RESULTS/install.log" 2>&1
part=${1:?part: moe_hazard, svdquant_tuned, turboquant_tune, offload_crossover or tables}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
case $part in
moe_hazard)
  timeout 420 python3 -m tools.probes.trtllm_moe_wgmma_hazard --out "$RESULTS/trtllm_moe_wgmma_hazard.json" \
    2>&1 | tee "$RESULTS/trtllm_moe_wgmma_hazard.log" | cut -c1-240
  ;;
svdquant_tuned)
  for set in nvfp4 int4; do
    timeout 420 python3 -m quantcore bench svdquant_prequant --device cuda --graph --shapes $set --out "$RESULTS" \
      > "$RESULTS/svdquant-$set.log" 2>&1
    grep -E "tuned|met|missed" "$RESULTS/svdquant-$set.log" | tail -20
  done
  ;;
turboquant_tune)
  timeout 420 python3 -m tools.probes.turboquant_tune --out "$RESULTS/turboquant-tuned.json" \
    > "$RESULTS/turboquant-tune.log" 2>&1
  grep -E "^  (gemv|mma|crossover|wrote)" "$RESULTS/turboquant-tune.log" | tail -30
  ;;
offload_crossover)
  timeout 420 python3 -m quantcore bench turboquant_offload --device cuda --shapes crossover --rounds 3 \
    --out "$RESULTS" 2>&1 | tail -16
  ;;
tables)
  python3 - <<'PY'
import torch
from quantcore.probe.card import card_key
from quantcore.probe.card_tables import nearest_key
from quantcore.backends.turboquant_triton import configs
from quantcore.backends.trtllm_moe.tiles import TABLES
from quantcore.kernels.svdquant.configs import SHIPPED
card = card_key(0)
print(torch.cuda.get_device_name(), card)
for name, tables in (("turboquant_triton", configs.tables()), ("trtllm_moe", TABLES), ("svdquant", SHIPPED)):
    print(f"{name}: {nearest_key(tables, card)}")
PY
  timeout 300 python3 -m quantcore bench turboquant_linear --device cuda --graph --rounds 3 --out "$RESULTS" \
    --shape M=1,K=4096,N=14336 --shape M=16,K=4096,N=14336 --shape M=1,K=14336,N=4096 2>&1 | tail -24
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
