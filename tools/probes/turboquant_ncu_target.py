"""A fixed workload for Nsight Compute (a developer's probe, CUDA): one TurboQuant layer
run on a chosen path a few times, so ``ncu -k regex:KERNEL -s 2 -c 1`` profiles a warm
launch of it.

    ncu --set full -k regex:gemv_kernel -s 2 -c 1 \\
        python -m tools.probes.turboquant_ncu_target --k 4096 --n 14336 --m 1 --path gemv

``--halves on|off`` runs the decode kernel with the card's table plan, its index words read
as two halves of a row or not (``GemvConfig.halves``).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from quantcore.backends.turboquant_triton import configs
from quantcore.backends.turboquant_triton.fused import fused_linear
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.formats.turboquant import TurboQuant
from quantcore.probe.card import card_key


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=14336)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--path", default=None)
    ap.add_argument("--residual", action="store_true")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--halves", choices=("on", "off"), default=None)
    args = ap.parse_args()
    fmt = TurboQuant(bits=4, group_size=128, residual=args.residual)
    gen = torch.Generator(device="cuda").manual_seed(0)
    stored = fmt.quantize(torch.randn(args.n, args.k, device="cuda", generator=gen) * 0.02,
                          generator=torch.Generator().manual_seed(0))
    kernel = TurboQuantTriton(fmt, "cuda")
    prepared = kernel.prepare(stored, dtype=torch.bfloat16)
    x = torch.randn(args.m, args.k, device="cuda", dtype=torch.bfloat16, generator=gen)
    config = None
    if args.halves is not None:
        table = configs.gemv_config(card_key(0), args.k, args.n, 128, 1 + args.residual, torch.bfloat16)
        config = dataclasses.replace(table, halves=args.halves == "on")
        print(config, flush=True)
    for _ in range(args.calls):
        fused_linear(x, prepared.passes, prepared.codebook, group_size=128, partial=None, bias=None,
                     out_dtype=torch.bfloat16, path="gemv" if config else args.path, config=config)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
