"""One benchmark case of a quantized linear, whatever the format: every kernel that can
run it here (as ``explain`` ranks them) on rotating prepared weights, against dense
``F.linear`` in the activation dtype (and in fp32 where that takes under a few seconds)
on the same shape, the one ``get_kernel`` chooses by default marked. Suites give the
format, the weights and the byte count; a suite may add peers of its own per kernel
(``extra``) and leave out kernels that would take minutes at a shape (``skip``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from quantcore.dtypes import dtype_name
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
#: ``skip(kernel name, dims)`` → why the kernel is not timed at these dims, or None.
Skip = Callable[[str, dict[str, int]], "str | None"]
#: Dense fp32 peers above this many flops take seconds per call: not timed.
FP32_PEER_MAX_FLOPS = 2**36


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
    skip: Skip | None = None,
) -> BenchCase:
    dev = torch.device(device)
    m, k, n = dims["M"], dims["K"], dims["N"]
    problem = Problem.linear(fmt, M=m, K=k, N=n, dtype=dtype)
    tag = "" if dtype == torch.bfloat16 else f"-{dtype_name(dtype)}"
    case = BenchCase(suite, f"M{m}-K{k}-N{n}{tag}", dict(dims))
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
        why = skip(cand.kernel, dims) if skip is not None else None
        if why:
            case.skipped[cand.kernel] = f"not timed: {why}"
            continue
        kernel = default_registry().kernel(fmt.name, "linear", cand.kernel).cls(fmt, dev)
        prepared = [kernel.prepare({a: t.to(dev) for a, t in w.items()}, dtype=dtype) for w in stored]
        nbytes = quant_bytes if cand.kernel != "torch_fallback" else 2 * (k * n + m * k + m * n)
        case.variants.append(Variant(cand.kernel, "kernel", call(kernel, prepared, xs), nbytes, flops, sets,
                                     candidate=fmt.slug, keeps_dense=cand.keeps_dense, chosen=cand.kernel == chosen))
        if extra is not None:
            case.variants += extra(cand.kernel, prepared, xs, nbytes, flops, sets)
    for peer_dtype in (dtype, torch.float32):
        name = f"dense_{dtype_name(peer_dtype)}"
        if peer_dtype == torch.float32 and flops > FP32_PEER_MAX_FLOPS:
            case.skipped[name] = f"not timed: {flops / 1e9:.0f} GFLOP in fp32 takes seconds per round"
            continue
        ws = [torch.randn(n, k, device=dev, dtype=peer_dtype) for _ in range(rotation_sets(k * n * peer_dtype.itemsize, device))]
        xd = [x.to(peer_dtype) for x in xs]
        case.variants.append(Variant(
            name, "peer", lambda i, ws=ws, xd=xd: torch.nn.functional.linear(xd[i % len(xd)], ws[i % len(ws)]),
            peer_dtype.itemsize * (k * n + m * k + m * n), flops, len(ws), "cuBLAS" if dev.type == "cuda" else "",
        ))
    return case
