"""The launches ``ncu`` profiles for the warp-level decode experiment: a 4-bit g128 weight
of K×N, one activation row, a K split and the K-groups a program.

    ncu -k regex:decode_kernel --launch-skip 3 --launch-count 1 \\
        python -m tools.probes.hopper_decode_ncu_target 4096 14336 4 1
"""

from __future__ import annotations

import sys

import torch

from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.formats.gptq import GPTQ

from .hopper_decode import decode


def main() -> None:
    k, n, split, groups = (int(v) for v in sys.argv[1:5])
    fmt = GPTQ(bits=4, group_size=128, sym=True)
    kernel = HopperWgmmaGPTQ(fmt, torch.device("cuda"))
    gen = torch.Generator().manual_seed(0)
    stored = fmt.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen)
    w = kernel.prepare({a: t.cuda() for a, t in stored.items()})
    x = torch.randn(1, k, generator=gen).cuda().bfloat16()
    for _ in range(4):
        decode(x, w, split, groups)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
