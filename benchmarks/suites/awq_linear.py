"""AWQ 4-bit linear (GEMM layout): every kernel that can run here — ``awq_cpu`` on CPU,
``aten_cuda`` on NVIDIA GPUs, the dense fallback — against dense bf16 and fp32
``F.linear`` on the same shapes as ``gptq_linear``.

The kernels run the prepared (repacked) weights, so their timings compare directly
with ``gptq_linear``'s; the difference between the two formats is all in ``prepare``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from quantcore.formats.awq import AWQ
from quantcore.problem import Problem
from quantcore.registry import default_registry
from quantcore.selection import explain

from ..memory import rotation_sets
from ..spec import BenchCase, Variant
from .gptq_linear import SHAPES, _call

__all__ = ["DESCRIPTION", "SHAPES", "cases"]

DESCRIPTION = "AWQ int4 g128 linear (zero points): registered kernels vs dense bf16/fp32"
FMT = AWQ(bits=4, group_size=128, zero_point=True)
DTYPE = torch.bfloat16


def _weights(k: int, n: int, sets: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    base = FMT.quantize(torch.randn(n, k, generator=gen) * 0.02)
    out = [base]
    for _ in range(sets - 1):
        t = dict(base)  # same scales and zeros, fresh random codes: distinct memory, same work
        t["qweight"] = torch.randint(-(2**31), 2**31 - 1, base["qweight"].shape, generator=gen, dtype=torch.int32)
        out.append(t)
    return out


def _awq_bytes(m: int, k: int, n: int) -> int:
    groups = k // FMT.group_size
    return k * n // 2 + groups * n * 2 + groups * n // 2 + 2 * m * k + 2 * m * n


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    dev = torch.device(device)
    for dims in shapes:
        m, k, n = dims["M"], dims["K"], dims["N"]
        problem = Problem.linear(FMT, M=m, K=k, N=n, dtype=DTYPE)
        case = BenchCase("awq_linear", f"M{m}-K{k}-N{n}", dict(dims))
        flops = 2 * m * k * n
        sets = rotation_sets(k * n // 2, device)
        weights = _weights(k, n, sets)
        xs = [torch.randn(m, k, device=dev, dtype=DTYPE) for _ in range(sets)]
        for cand in explain(FMT, device, problem=problem).candidates:
            if cand.status not in ("selected", "usable"):
                if cand.status != "broken":
                    case.skipped[cand.kernel] = f"{cand.status}: {cand.reason}"
                continue
            kernel = default_registry().kernel(FMT.name, "linear", cand.kernel).cls(FMT, dev)
            prepared = [kernel.prepare({a: t.to(dev) for a, t in w.items()}, dtype=DTYPE) for w in weights]
            nbytes = _awq_bytes(m, k, n) if cand.kernel != "torch_fallback" else 2 * (k * n + m * k + m * n)
            case.variants.append(Variant(cand.kernel, "kernel", _call(kernel, prepared, xs), nbytes, flops, sets))
        for dtype, name in ((torch.bfloat16, "dense_bf16"), (torch.float32, "dense_fp32")):
            ws = [torch.randn(n, k, device=dev, dtype=dtype) for _ in range(rotation_sets(k * n * dtype.itemsize, device))]
            xd = [x.to(dtype) for x in xs]
            case.variants.append(Variant(
                name, "peer", lambda i, ws=ws, xd=xd: torch.nn.functional.linear(xd[i % len(xd)], ws[i % len(ws)]),
                dtype.itemsize * (k * n + m * k + m * n), flops, len(ws), "cuBLAS" if dev.type == "cuda" else "",
            ))
        yield case


def summarize(rows: list[dict]) -> list[str]:
    notes = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["case"] == case and r["role"] != "skipped"}
        for kernel in ("awq_cpu", "aten_cuda"):
            if kernel in mine:
                notes.append(f"{case}: {kernel} {mine[kernel]['speedup_vs'].get('dense_bf16', 0):.2f}× dense bf16 "
                             f"(target at M=1: ≥ 1.5×)")
    return notes
