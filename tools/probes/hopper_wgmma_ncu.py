"""The launches ``ncu`` profiles for ``hopper_wgmma``: one layer (GPTQ 4-bit g128, bf16) at
one M, called twice (the first compiles), so that ``--launch-skip 1 --launch-count 1 -k
regex:wgmma`` catches the second. An optional fourth argument names the plan instead of
the table's, as ``hopper_plan_times.py`` spells it.

    ncu --clock-control none -k regex:wgmma --launch-skip 1 --launch-count 1 \\
        python3 -m tools.probes.hopper_wgmma_ncu M K N [1,8,8,1,in_flight]
"""

from __future__ import annotations

import sys

import torch

from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.launch import linear
from quantcore.formats.gptq import GPTQ

from .hopper_plan_times import parse_plan


def main(argv: list[str]) -> int:
    m, k, n = (int(v) for v in argv[:3])
    fmt = GPTQ(bits=4, group_size=128)
    gen = torch.Generator().manual_seed(0)
    stored = fmt.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen)
    dev = torch.device("cuda")
    kernel = HopperWgmmaGPTQ(fmt, dev)
    prepared = kernel.prepare({a: t.to(dev) for a, t in stored.items()})
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    plan = parse_plan(argv[3]) if len(argv) > 3 else None
    for _ in range(2):
        if plan is None:
            kernel(x, prepared)
        else:
            linear(x, prepared, plan)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
