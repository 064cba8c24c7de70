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

from ..spec import BenchCase, Variant
from ._linear import linear_case

DESCRIPTION = "GPTQ int4 g128 linear: registered kernels vs dense bf16/fp32 and torch's int4 op"
_KN = ((4096, 4096), (4096, 11008))
SHAPES = {
    "default": [{"M": m, "K": k, "N": n} for (k, n), m in itertools.product(_KN, (1, 8, 32))],
    "decode": [{"M": 1, "K": k, "N": n} for k, n in _KN],
    "prefill": [{"M": m, "K": k, "N": n} for (k, n), m in itertools.product(_KN, (128, 2048))],
    # M = 1 … 2048 on one shape: where the default choice has to move (issue 15).
    "sweep": [{"M": 1 << i, "K": 4096, "N": 4096} for i in range(12)],
}
FMT = GPTQ(bits=4, group_size=128, sym=True)
DTYPE = torch.bfloat16


def weights(k: int, n: int, sets: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    base = FMT.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen)
    out = [base]
    for _ in range(sets - 1):
        # Same scales and g_idx, fresh random codes: distinct memory, same work.
        t = dict(base)
        t["qweight"] = torch.randint(-(2**31), 2**31 - 1, base["qweight"].shape, generator=gen, dtype=torch.int32)
        out.append(t)
    return out


def int4_bytes(m: int, k: int, n: int) -> int:
    groups = k // FMT.group_size
    return k * n // 2 + groups * n * 2 * 2 + 2 * m * k + 2 * m * n


def problems(shapes: list[dict[str, int]]) -> list[Problem]:
    """The problems the suite's cases time (``quantcore tune --suite``)."""
    return [Problem.linear(FMT, M=s["M"], K=s["K"], N=s["N"], dtype=DTYPE) for s in shapes]


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    for dims in shapes:
        m, k, n = dims["M"], dims["K"], dims["N"]
        yield linear_case("gptq_linear", FMT, DTYPE, dims, device, weights, int4_bytes(m, k, n), raw_op_peer)


def raw_op_peer(kernel: str, prepared: list[Any], xs: list[torch.Tensor], nbytes: int, flops: int, sets: int) -> list[Variant]:
    if kernel != "aten_cpu":
        return []
    return [Variant("aten_op_raw", "peer", _raw_cpu(prepared, xs), nbytes, flops, sets,
                    "torch's op on aten_cpu's prepared tensors")]


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
