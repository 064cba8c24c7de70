"""GPTQ 4-bit linear: every kernel that can run here vs dense matmul and torch's own
int4 op, on the same weights.

Peers: dense bf16 and fp32 ``F.linear`` (cuBLAS on CUDA); torch's raw int4 op on the
very tensors ``aten_cpu`` prepared (so the gap to it is quantcore's call overhead).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

import torch

from quantcore.formats.gptq import GPTQ
from quantcore.problem import Problem

from ..memory import with_fresh_codes
from ..spec import BenchCase, Variant
from ._linear import linear_case

DESCRIPTION = "GPTQ int4 g128 linear: registered kernels vs dense bf16/fp32 and torch's int4 op"
_KN = ((4096, 4096), (4096, 11008))
#: The H100 grid: Llama-3-8B's attention and MLP projections, decode to prefill.
H100_KN = ((4096, 4096), (4096, 14336), (14336, 4096))
H100_M = (1, 4, 16, 32, 64, 128, 512, 2048)
#: Hopper's grid (sm_90 kernels against cuBLAS and each other): the projections above plus
#: a small-N one, decode to prefill, in bf16 and fp16 (``fp16: 1``).
HOPPER_KN = ((4096, 14336), (14336, 4096), (4096, 4096), (4096, 1024))
HOPPER_M = (1, 16, 32, 64, 128, 512, 2048, 8192)
HOPPER = [{"M": m, "K": k, "N": n, **({"fp16": 1} if f16 else {})}
          for (k, n), f16, m in itertools.product(HOPPER_KN, (0, 1), HOPPER_M)]
SHAPES = {
    "default": [{"M": m, "K": k, "N": n} for (k, n), m in itertools.product(_KN, (1, 8, 32))],
    "decode": [{"M": 1, "K": k, "N": n} for k, n in _KN],
    "prefill": [{"M": m, "K": k, "N": n} for (k, n), m in itertools.product(_KN, (128, 2048))],
    "h100": [{"M": m, "K": k, "N": n} for (k, n), m in itertools.product(H100_KN, H100_M)],
    "hopper": HOPPER,
    "hopper-decode": [case for case in HOPPER if case["M"] == 1],
    # M = 1 … 2048 on one shape: where the default choice has to move.
    "sweep": [{"M": 1 << i, "K": 4096, "N": 4096} for i in range(12)],
}
FMT = GPTQ(bits=4, group_size=128, sym=True)
DTYPE = torch.bfloat16


@functools.lru_cache(maxsize=1)
def _quantized(k: int, n: int, seed: int) -> dict[str, torch.Tensor]:
    """The golden quantization of one (K, N), kept while a shape set walks its Ms."""
    gen = torch.Generator().manual_seed(seed)
    return FMT.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen)


def weights(k: int, n: int, sets: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    return with_fresh_codes(_quantized(k, n, seed), sets, torch.Generator().manual_seed(seed + 1))


def int4_bytes(m: int, k: int, n: int) -> int:
    groups = k // FMT.group_size
    return k * n // 2 + groups * n * 2 * 2 + 2 * m * k + 2 * m * n


def dtype_of(dims: dict[str, int]) -> torch.dtype:
    """The activation dtype of a shape: bf16, or fp16 where it says ``fp16: 1``."""
    return torch.float16 if dims.get("fp16") else DTYPE


#: tinygemm (``aten_cuda``) from M = 1024 on takes 20–80× cuBLAS (32 ms a call at
#: 8192 × 4096 × 14336): minutes per case, and no contender there.
SLOW_FROM_M = {"aten_cuda": 1024}


def skip_slow(kernel: str, dims: dict[str, int]) -> str | None:
    lim = SLOW_FROM_M.get(kernel)
    if lim is not None and dims["M"] >= lim:
        return f"{kernel} from M = {lim} on runs 20-80x slower than cuBLAS (benchmarks/results)"
    return None


def problems(shapes: list[dict[str, int]]) -> list[Problem]:
    """The problems the suite's cases time (``quantcore tune --suite``)."""
    return [Problem.linear(FMT, M=s["M"], K=s["K"], N=s["N"], dtype=dtype_of(s)) for s in shapes]


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    for dims in shapes:
        m, k, n = dims["M"], dims["K"], dims["N"]
        yield linear_case("gptq_linear", FMT, dtype_of(dims), dims, device, weights, int4_bytes(m, k, n), raw_op_peer,
                          skip_slow)


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


#: Goals for 4-bit: dense matmul time (cuBLAS, the activation dtype) over the kernel's, by
#: M; "large" for K×N 4096×14336 and 14336×4096, "small" for the smaller layers.
GOALS = {
    "large": {1: 3.2, 16: 3.0, 32: 2.7, 64: 2.3, 128: 1.7, 512: 1.05, 2048: 0.97, 8192: 0.95},
    "small": {1: 2.2, 16: 2.0, 32: 1.6, 64: 1.3, 128: 1.1, 512: 0.95, 2048: 0.95, 8192: 0.95},
}
LARGE_KN = ((4096, 14336), (14336, 4096))


def goal_notes(rows: list[dict[str, Any]], kernel: str | None, goals: dict[str, dict[int, float]],
               copy_goal_m1: float | None) -> list[str]:
    """One line per case: the speed-up over the dense peer of ``kernel`` (None: the one
    ``get_kernel`` chose) against the goal for its size class, its share of copy
    bandwidth at small M and of matmul throughput at large M."""
    notes = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["case"] == case and r["role"] != "skipped"}
        name = kernel or next((v for v, r in mine.items() if r.get("chosen")), None)
        dense = next((v for v in mine if v.startswith("dense_") and v != "dense_fp32"), None)
        if name not in mine or dense is None or dense not in mine[name]["speedup_vs"]:
            continue
        r = mine[name]
        m, kn = r["dims"]["M"], (r["dims"]["K"], r["dims"]["N"])
        ratio = r["speedup_vs"][dense]
        goal = goals["large" if kn in LARGE_KN else "small"].get(m)
        line = f"{case}: {name} {ratio:.2f}× {dense}"
        if goal is not None:
            line += f" (goal ≥ {goal}×: {'met' if ratio >= goal else 'missed'})"
        if m <= 16:
            line += f", {100 * r['copy_share']:.0f}% of copy BW"
            if m == 1 and copy_goal_m1 is not None and kn in LARGE_KN:
                line += f" (goal ≥ {100 * copy_goal_m1:.0f}%)"
        if m >= 512:
            line += f", {100 * r['matmul_share']:.0f}% of matmul"
        if "aten_cuda" in r["speedup_vs"]:
            line += f", {r['speedup_vs']['aten_cuda']:.2f}× aten_cuda"
        notes.append(line)
    return notes


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    notes = goal_notes(rows, None, GOALS, 0.8)
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["case"] == case and r["role"] != "skipped"}
        if "aten_cpu" in mine and "aten_op_raw" in mine:
            over = mine["aten_cpu"]["time_s"] / mine["aten_op_raw"]["time_s"] - 1
            notes.append(f"{case}: aten_cpu through the registry costs {100 * over:+.1f}% over the raw op "
                         f"(target at M=1: ≤ +3%); {mine['aten_cpu']['speedup_vs'].get('dense_bf16', 0):.2f}× dense bf16")
    return notes
