"""TurboQuant 4-bit linear (group 128): every registered kernel, one pass and with the
residual pass, against cuBLAS bf16 dense on the same shapes.

Each call includes the input rotation (the small GEMM) and, for ``+res``, both passes.
Bytes are the format's minimum: indices (K/2 per row), fp16 norms and the rotation of
each pass, the activation read once and the output written once. Targets:
at M = 1 on the largest shapes ≥ 3× dense bf16 and ≥ 80% of the copy bandwidth; M = 16
≥ 2×; M = 2048 ≥ 0.8×; the residual pair at M = 1 ≥ 1.7×; cuTile within 1.2× of Triton.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import torch

from quantcore.formats.turboquant import TurboQuant
from quantcore.problem import Problem
from quantcore.registry import default_registry
from quantcore.selection import explain

from ..choice import default_choice
from ..memory import rotation_sets
from ..spec import BenchCase, Variant

DESCRIPTION = "TurboQuant 4-bit g128 linear (± residual pass): registered kernels vs cuBLAS bf16"
_KN = ((4096, 4096), (4096, 14336), (14336, 4096))
SHAPES = {
    "default": [{"M": m, "K": k, "N": n} for (k, n), m in itertools.product(_KN, (1, 16, 128, 2048))],
    "decode": [{"M": 1, "K": k, "N": n} for k, n in _KN],
    # One row and the most the mma.sync decode kernel takes (backends/turboquant_triton/decode_mma.py).
    "small_batch": [{"M": m, "K": k, "N": n} for (k, n), m in itertools.product(_KN, (1, 8))],
    "prefill": [{"M": 2048, "K": k, "N": n} for k, n in _KN],
    "sweep": [{"M": 1 << i, "K": 4096, "N": 4096} for i in range(12)],
    # Sized for a CPU (turboquant_torch's per-group loop is slow there).
    "cpu": [{"M": m, "K": 1024, "N": 1024} for m in (1, 16, 128, 2048)],
}
FMT = TurboQuant(bits=4, group_size=128)
DTYPE = torch.bfloat16
#: The kernels this suite times (the dequantizing fallback is dense bf16 once prepared).
SKIP = {"torch_fallback": "dequantizes once at prepare: it is the dense_bf16 peer"}


def format_bytes(fmt: TurboQuant, m: int, k: int, n: int) -> int:
    groups, d = k // fmt.group_size, fmt.group_size
    per_pass = n * k // 2 + n * groups * fmt.norm_dtype.itemsize + fmt.num_rotations(k) * d * d * 4
    return len(fmt.passes) * per_pass + 2 * m * k + 2 * m * n


_cache: dict[tuple[Any, ...], list[dict[str, torch.Tensor]]] = {}


def weight_sets(fmt: TurboQuant, k: int, n: int, device: str) -> list[dict[str, torch.Tensor]]:
    """Quantized weights, several copies (fresh random indices, same norms and rotations:
    distinct memory, same work) so that together they exceed the L2 cache."""
    key = (fmt, k, n, device)
    if key not in _cache:
        _cache.clear()
        gen = torch.Generator().manual_seed(0)
        weight = (torch.randn(n, k, generator=gen) * 0.02).to(device)
        base = fmt.quantize(weight, generator=gen)
        sets = rotation_sets(format_bytes(fmt, 0, k, n), device)
        out = [base]
        for _ in range(sets - 1):
            t = dict(base)
            for name in base:
                if name.endswith("indices"):
                    t[name] = torch.randint(0, 256, base[name].shape, dtype=torch.uint8, device=device)
            out.append(t)
        _cache[key] = out
    return _cache[key]


def problems(shapes: list[dict[str, int]]) -> list[Problem]:
    """The problems the suite's cases time (``quantcore tune --suite``)."""
    return [Problem.linear(fmt, M=s["M"], K=s["K"], N=s["N"], dtype=DTYPE)
            for s in shapes for fmt in (FMT, dataclasses.replace(FMT, residual=True))]


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    dev = torch.device(device)
    for dims in shapes:
        m, k, n = dims["M"], dims["K"], dims["N"]
        case = BenchCase("turboquant_linear", f"M{m}-K{k}-N{n}", dict(dims))
        flops = 2 * m * k * n
        xs = [torch.randn(m, k, device=dev, dtype=DTYPE) for _ in range(4)]
        for fmt, tag in ((FMT, ""), (dataclasses.replace(FMT, residual=True), "+res")):
            weights = weight_sets(fmt, k, n, device)
            problem = Problem.linear(fmt, M=m, K=k, N=n, dtype=DTYPE)
            chosen = default_choice(fmt, device, problem)
            for cand in explain(fmt, device, problem=problem).candidates:
                if cand.kernel in SKIP or cand.status not in ("selected", "usable"):
                    if cand.status not in ("broken",) and not tag:
                        case.skipped[cand.kernel] = SKIP.get(cand.kernel) or f"{cand.status}: {cand.reason}"
                    continue
                kernel = default_registry().kernel(fmt.name, "linear", cand.kernel).cls(fmt, dev)
                prepared = [kernel.prepare(w, dtype=DTYPE) for w in weights]
                case.variants.append(Variant(
                    cand.kernel + tag, "kernel",
                    lambda i, kernel=kernel, prepared=prepared, xs=xs: kernel(xs[i % len(xs)], prepared[i % len(prepared)]),
                    format_bytes(fmt, m, k, n), flops * len(fmt.passes), len(prepared),
                    candidate=fmt.slug, keeps_dense=cand.keeps_dense, chosen=cand.kernel == chosen,
                ))
        sets = rotation_sets(2 * k * n, device)
        ws = [torch.randn(n, k, device=dev, dtype=DTYPE) for _ in range(sets)]
        case.variants.append(Variant(
            "dense_bf16", "peer", lambda i, ws=ws, xs=xs: torch.nn.functional.linear(xs[i % len(xs)], ws[i % len(ws)]),
            2 * (k * n + m * k + m * n), flops, sets, "cuBLAS" if dev.type == "cuda" else "",
        ))
        yield case


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    notes = []
    by_case: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["role"] != "skipped":
            by_case.setdefault(r["case"], {})[r["variant"]] = r
    for case, mine in by_case.items():
        m, k, n = (int(v) for v in case.replace("M", "").replace("K", "").replace("N", "").split("-"))
        tri = mine.get("turboquant_triton")
        if tri is None:
            continue
        vs = tri["speedup_vs"].get("dense_bf16", 0.0)
        if m == 1 and k * n == 4096 * 14336:
            notes.append(f"{case}: triton {vs:.2f}× dense bf16 (target ≥ 3×), {100 * tri['copy_share']:.0f}% "
                         "of copy bandwidth (target ≥ 80%)")
            res = mine.get("turboquant_triton+res")
            if res is not None:
                notes.append(f"{case}: triton with residual {res['speedup_vs'].get('dense_bf16', 0.0):.2f}× "
                             "dense bf16 (target ≥ 1.7×)")
        if m == 16:
            notes.append(f"{case}: triton {vs:.2f}× dense bf16 (target ≥ 2×)")
        if m == 2048:
            notes.append(f"{case}: triton {vs:.2f}× dense bf16 (target ≥ 0.8×)")
        cut = mine.get("turboquant_cutile")
        if cut is not None:
            notes.append(f"{case}: cutile / triton time {cut['time_s'] / tri['time_s']:.2f} (target ≤ 1.2)")
    return notes
