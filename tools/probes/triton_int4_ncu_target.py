"""Launches for ``ncu`` to profile: triton_int4 at M = 1 and M = 128 and torch's tinygemm
at M = 1, on K×N = 4096×14336 (GPTQ 4-bit g128, bf16), each once.

    ncu -k regex:"mma_kernel|tinygemm" -c 3 --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats python -m tools.probes.triton_int4_ncu_target
"""

from __future__ import annotations

import torch

from quantcore.backends.aten_cuda.kernel import AtenCudaGPTQ
from quantcore.backends.triton_int4.kernel import TritonInt4GPTQ
from quantcore.formats.gptq import GPTQ


def main() -> None:
    fmt = GPTQ(bits=4, group_size=128)
    k, n = 4096, 14336
    gen = torch.Generator().manual_seed(0)
    tensors = {a: t.cuda() for a, t in fmt.quantize(torch.randn(n, k, generator=gen) * 0.02).items()}
    mine = TritonInt4GPTQ(fmt, "cuda")
    prepared = mine.prepare(tensors)
    for m in (1, 128):
        mine(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), prepared)
    tiny = AtenCudaGPTQ(fmt, "cuda")
    tiny(torch.randn(1, k, device="cuda", dtype=torch.bfloat16), tiny.prepare(tensors, dtype=torch.bfloat16))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
