"""One benchmark case of a quantized linear, whatever the format: every kernel that can
run it here (as ``explain`` ranks them) on rotating prepared weights, against dense bf16
and fp32 ``F.linear`` on the same shape, the one ``get_kernel`` chooses by default marked.
Suites give the format, the weights and the byte count; a suite may add peers of its own
per kernel (``extra``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from quantcore.formats.base import Format
from quantcore.problem import Problem
from quantcore.registry import default_registry
from quantcore.selection import explain

from ..choice import default_choice
from ..memory import rotation_sets
from ..spec import BenchCase, Variant

__all__ = ["call", "linear_case"]

#: ``extra(kernel name, prepared weights, activations, bytes, flops, sets)`` → more variants.
Extra = Callable[[str, list[Any], list[torch.Tensor], int, int, int], list[Variant]]


def call(kernel: Any, prepared: list[Any], xs: list[torch.Tensor]) -> Callable[[int], Any]:
    return lambda i: kernel(xs[i % len(xs)], prepared[i % len(prepared)])


def linear_case(
    suite: str,
    fmt: Format,
    dtype: torch.dtype,
    dims: dict[str, int],
    device: str,
    weights: Callable[[int, int, int], list[dict[str, torch.Tensor]]],
    quant_bytes: int,
    extra: Extra | None = None,
) -> BenchCase:
    dev = torch.device(device)
    m, k, n = dims["M"], dims["K"], dims["N"]
    problem = Problem.linear(fmt, M=m, K=k, N=n, dtype=dtype)
    case = BenchCase(suite, f"M{m}-K{k}-N{n}", dict(dims))
    flops = 2 * m * k * n
    sets = rotation_sets(k * n // 2, device)
    stored = weights(k, n, sets)
    xs = [torch.randn(m, k, device=dev, dtype=dtype) for _ in range(sets)]
    chosen = default_choice(fmt, device, problem)
    for cand in explain(fmt, device, problem=problem).candidates:
        if cand.status not in ("selected", "usable"):
            if cand.status != "broken":
                case.skipped[cand.kernel] = f"{cand.status}: {cand.reason}"
            continue
        kernel = default_registry().kernel(fmt.name, "linear", cand.kernel).cls(fmt, dev)
        prepared = [kernel.prepare({a: t.to(dev) for a, t in w.items()}, dtype=dtype) for w in stored]
        nbytes = quant_bytes if cand.kernel != "torch_fallback" else 2 * (k * n + m * k + m * n)
        case.variants.append(Variant(cand.kernel, "kernel", call(kernel, prepared, xs), nbytes, flops, sets,
                                     candidate=fmt.slug, keeps_dense=cand.keeps_dense, chosen=cand.kernel == chosen))
        if extra is not None:
            case.variants += extra(cand.kernel, prepared, xs, nbytes, flops, sets)
    for peer_dtype, name in ((torch.bfloat16, "dense_bf16"), (torch.float32, "dense_fp32")):
        ws = [torch.randn(n, k, device=dev, dtype=peer_dtype) for _ in range(rotation_sets(k * n * peer_dtype.itemsize, device))]
        xd = [x.to(peer_dtype) for x in xs]
        case.variants.append(Variant(
            name, "peer", lambda i, ws=ws, xd=xd: torch.nn.functional.linear(xd[i % len(xd)], ws[i % len(ws)]),
            peer_dtype.itemsize * (k * n + m * k + m * n), flops, len(ws), "cuBLAS" if dev.type == "cuda" else "",
        ))
    return case
