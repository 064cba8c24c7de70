"""Run the decode kernel at 4096 × 14336, M = 1, bf16, with each codebook lookup
(``configs.LOOKUPS``, ``pairs.py``), the card's shipped geometry otherwise, for ``ncu``:

    ncu -k regex:gemv_kernel --section SpeedOfLight --section WarpStateStats \\
        --section Occupancy python -m tools.probes.turboquant_gemv_pairs_ncu
"""

from __future__ import annotations

import dataclasses

import torch

from quantcore.backends.turboquant_triton import configs
from quantcore.backends.turboquant_triton.fused import fused_linear
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.formats.turboquant import TurboQuant
from quantcore.probe.card import card_key

K, N = 4096, 14336


def main() -> None:
    fmt = TurboQuant(bits=4, group_size=128)
    t = fmt.quantize(torch.randn(N, K) * 0.05)
    prep = TurboQuantTriton(fmt, "cuda").prepare({k: v.cuda() for k, v in t.items()}, dtype=torch.bfloat16)
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    shipped = configs.gemv_config(card_key(0), K, N, 128, 1, torch.bfloat16)
    for cfg in (dataclasses.replace(shipped, lookup=lookup) for lookup in configs.LOOKUPS):
        print(cfg, flush=True)
        for _ in range(2):
            fused_linear(x, prep.passes, prep.codebook, group_size=128, partial=None, bias=None,
                         out_dtype=torch.bfloat16, path="gemv", config=cfg)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
