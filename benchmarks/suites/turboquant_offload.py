"""TurboQuant CPU offload of pass 2: a stack of L residual layers run resident vs with
pass 2 streamed from pinned host memory through the double-buffered scratch pool.

Peers: the H2D copies alone (every layer's pass-2 data, pinned → device, back to back)
and the resident stack. If the prefetch chain overlaps copies with compute, the offload
time approaches max(resident, copies) rather than their sum; the summary reports the
overhead over resident (target ≤ 10%), the share of the copy time hidden, and what that
model predicts from the same run's resident and copy times.

The ``crossover`` shape set finds where the copy hides: M from 1 to 8192, dense between
128 and 2048 (where the H100's resident stack first outlasts its copies), in one call;
the summary names the smallest measured M from which every larger one is within +10%
(docs/formats/turboquant.md, "Where the copy hides").
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from quantcore.formats.turboquant import TurboQuant
from quantcore.nn.turboquant.model import enable_pass2_offload
from quantcore.nn.turboquant.module import TurboQuantLinear

from ..spec import BenchCase, Variant
from .turboquant_linear import format_bytes

#: Never timed as a CUDA graph: the prefetch chain's copy stream and events are what it measures.
GRAPH_SAFE = False
DESCRIPTION = "TurboQuant residual stack: pass 2 resident vs offloaded to pinned host memory"
SHAPES = {
    "default": [{"M": m, "K": 4096, "N": 4096, "L": 8} for m in (1, 128, 2048, 8192)],
    "crossover": [{"M": m, "K": 4096, "N": 4096, "L": 8}
                  for m in (1, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 8192)],
}
#: The overhead over resident the offloaded stack may cost (the seed's ~10 %).
TARGET = 0.10
FMT = TurboQuant(bits=4, group_size=128, residual=True)
DTYPE = torch.bfloat16


def stack(k: int, layers: int, device: str) -> nn.Sequential:
    gen = torch.Generator().manual_seed(0)
    mods = []
    for _ in range(layers):
        linear = nn.Linear(k, k, bias=False)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(k, k, generator=gen) * 0.02)
        # Prepared for the activations it is fed (bf16): a layer made from a float32 nn.Linear
        # without a dtype is prepared for float32, and would time float32 GEMMs.
        mods.append(TurboQuantLinear.from_linear(linear.to(device), FMT, generator=gen, dtype=DTYPE))
    return nn.Sequential(*mods)


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    dev = torch.device(device)
    for dims in shapes:
        m, k, n, layers = dims["M"], dims["K"], dims["N"], dims["L"]
        if k != n:
            raise ValueError("turboquant_offload: the stack needs K == N")
        case = BenchCase("turboquant_offload", f"M{m}-K{k}-N{n}-L{layers}", dict(dims))
        resident = stack(k, layers, device)
        offloaded = copy.deepcopy(resident)
        pool = enable_pass2_offload(offloaded)
        xs = [torch.randn(m, k, device=dev, dtype=DTYPE) for _ in range(2)]
        with torch.no_grad():
            offloaded(xs[0])  # first pass learns the chain order
            if not torch.equal(offloaded(xs[1]), resident(xs[1])):
                raise AssertionError("offloaded stack differs from the resident one")
        nbytes = layers * format_bytes(FMT, m, k, n)
        flops = 2 * 2 * m * k * n * layers
        case.variants.append(Variant("offload", "kernel", _run(offloaded, xs), nbytes, flops))
        case.variants.append(Variant("resident", "peer", _run(resident, xs), nbytes, flops))
        hosts = [e.flat for e in pool.chain]
        dst = [torch.empty_like(h, device=dev) for h in hosts]
        case.variants.append(Variant("h2d_copies", "peer", _copies(hosts, dst), sum(h.numel() for h in hosts),
                                     0, note="pass-2 data of all layers (packed), pinned → device"))
        yield case


def _run(model: nn.Module, xs: list[torch.Tensor]) -> Any:
    def call(i: int) -> torch.Tensor:
        with torch.no_grad():
            return model(xs[i % len(xs)])

    return call


def _copies(hosts: list[torch.Tensor], dst: list[torch.Tensor]) -> Any:
    def call(i: int) -> None:
        for h, d in zip(hosts, dst, strict=True):
            d.copy_(h, non_blocking=True)

    return call


def predicted_overhead(resident_s: float, copies_s: float) -> float:
    """The overlap model's offload overhead over resident: the stack takes the longer of
    its compute and its pass-2 copies, ``max(resident, copies) / resident − 1``."""
    return max(resident_s, copies_s) / resident_s - 1


def crossover(overheads: dict[int, float], target: float = TARGET) -> int | None:
    """The smallest M from which every measured M (itself and all larger) costs at most
    ``target`` over resident; None if the largest does not."""
    found = None
    for m in sorted(overheads, reverse=True):
        if overheads[m] > target:
            break
        found = m
    return found


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    notes = []
    measured: dict[tuple[int, int, int], dict[int, float]] = {}
    predicted: dict[tuple[int, int, int], dict[int, float]] = {}
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["case"] == case and r["role"] != "skipped"}
        if {"offload", "resident", "h2d_copies"} <= mine.keys():
            off, res, cp = (mine[v]["time_s"] for v in ("offload", "resident", "h2d_copies"))
            hidden = (res + cp - off) / min(res, cp)
            notes.append(f"{case}: offload {100 * (off / res - 1):+.1f}% over resident (target ≤ +{TARGET:.0%}); "
                         f"copies alone {cp * 1e6:.0f} µs, resident {res * 1e6:.0f} µs, "
                         f"{100 * min(max(hidden, 0.0), 1.0):.0f}% of the shorter one hidden by overlap; "
                         f"the overlap model predicts {100 * predicted_overhead(res, cp):+.1f}%")
            dims = mine["offload"]["dims"]
            layer = (dims["K"], dims["N"], dims["L"])
            measured.setdefault(layer, {})[dims["M"]] = off / res - 1
            predicted.setdefault(layer, {})[dims["M"]] = predicted_overhead(res, cp)
    for (k, n, layers), by_m in measured.items():
        if len(by_m) < 2:
            continue
        got, model = crossover(by_m), crossover(predicted[k, n, layers])
        said = f"from M = {got} on" if got is not None else "at no measured M"
        notes.append(f"K{k}-N{n}-L{layers}: offload within +{TARGET:.0%} of resident {said} (measured M: "
                     f"{', '.join(map(str, sorted(by_m)))}); the overlap model: "
                     f"{f'from M = {model} on' if model is not None else 'at no measured M'}")
    return notes
