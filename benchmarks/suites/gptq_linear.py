"""GPTQ 4-bit linear: every kernel that can run here vs dense matmul and torch's own
int4 op, on the same weights.

Peers: dense bf16 and fp32 ``F.linear`` (cuBLAS on CUDA); torch's raw int4 op on the
very tensors ``aten_cpu`` prepared (so the gap to it is quantcore's call overhead).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch

from quantcore.formats.gptq import GPTQ
from quantcore.problem import Problem
from quantcore.registry import default_registry
from quantcore.selection import explain

from ..memory import rotation_sets
from ..spec import BenchCase, Variant

DESCRIPTION = "GPTQ int4 g128 linear: registered kernels vs dense bf16/fp32 and torch's int4 op"
_KN = ((4096, 4096), (4096, 11008))
SHAPES = {
    "default": [{"M": m, "K": k, "N": n} for (k, n), m in itertools.product(_KN, (1, 8, 32))],
    "decode": [{"M": 1, "K": k, "N": n} for k, n in _KN],
    "prefill": [{"M": m, "K": k, "N": n} for (k, n), m in itertools.product(_KN, (128, 2048))],
}
FMT = GPTQ(bits=4, group_size=128, sym=True)
DTYPE = torch.bfloat16


def _weights(k: int, n: int, sets: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    base = FMT.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen)
    out = [base]
    for _ in range(sets - 1):
        # Same scales and g_idx, fresh random codes: distinct memory, same work.
        t = dict(base)
        t["qweight"] = torch.randint(-(2**31), 2**31 - 1, base["qweight"].shape, generator=gen, dtype=torch.int32)
        out.append(t)
    return out


def _int4_bytes(m: int, k: int, n: int) -> int:
    groups = k // FMT.group_size
    return k * n // 2 + groups * n * 2 * 2 + 2 * m * k + 2 * m * n


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    dev = torch.device(device)
    for dims in shapes:
        m, k, n = dims["M"], dims["K"], dims["N"]
        problem = Problem.linear(FMT, M=m, K=k, N=n, dtype=DTYPE)
        case = BenchCase("gptq_linear", f"M{m}-K{k}-N{n}", dict(dims))
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
            nbytes = _int4_bytes(m, k, n) if cand.kernel != "torch_fallback" else 2 * (k * n + m * k + m * n)
            case.variants.append(Variant(cand.kernel, "kernel", _call(kernel, prepared, xs), nbytes, flops, sets))
            if cand.kernel == "aten_cpu":
                case.variants.append(Variant("aten_op_raw", "peer", _raw_cpu(prepared, xs), nbytes, flops, sets,
                                             "torch's op on aten_cpu's prepared tensors"))
        for dtype, name in ((torch.bfloat16, "dense_bf16"), (torch.float32, "dense_fp32")):
            ws = [torch.randn(n, k, device=dev, dtype=dtype) for _ in range(rotation_sets(k * n * dtype.itemsize, device))]
            xd = [x.to(dtype) for x in xs]
            size = dtype.itemsize
            case.variants.append(Variant(
                name, "peer", lambda i, ws=ws, xd=xd: torch.nn.functional.linear(xd[i % len(xd)], ws[i % len(ws)]),
                size * (k * n + m * k + m * n), flops, len(ws), "cuBLAS" if dev.type == "cuda" else "",
            ))
        yield case


def _call(kernel: Any, prepared: list[Any], xs: list[torch.Tensor]) -> Any:
    return lambda i: kernel(xs[i % len(xs)], prepared[i % len(prepared)])


def _raw_cpu(prepared: list[Any], xs: list[torch.Tensor]) -> Any:
    op = torch.ops.aten._weight_int4pack_mm_for_cpu

    def run(i: int) -> torch.Tensor:
        p = prepared[i % len(prepared)]
        return op(xs[i % len(xs)], p.weight, p.group_size, p.for_dtype(DTYPE)[0])

    return run


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    notes = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["case"] == case and r["role"] != "skipped"}
        if "aten_cpu" in mine and "aten_op_raw" in mine:
            over = mine["aten_cpu"]["time_s"] / mine["aten_op_raw"]["time_s"] - 1
            notes.append(f"{case}: aten_cpu through the registry costs {100 * over:+.1f}% over the raw op "
                         f"(target at M=1: ≤ +3%); {mine['aten_cpu']['speedup_vs'].get('dense_bf16', 0):.2f}× dense bf16")
    return notes
