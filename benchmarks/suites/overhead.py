"""What quantcore itself costs: the import, get_kernel when its answer is cached, and the
host time of a call.

Targets: ``import quantcore`` ≤ 0.5 s and no triton; cached ``get_kernel``
≤ 5 µs; ``aten_cpu`` through quantcore ≤ 3% over torch's raw op at M = 1. Import time is
measured as a fresh interpreter importing quantcore, against one that imports nothing
(the difference is quantcore's) and one importing torch. The call overhead is measured
where it can be seen: at a shape so small that the op takes microseconds, the difference
between the kernel and the raw op on the same prepared tensors is quantcore's per-call
cost; it is then set against the raw op's time at K = N = 4096.

Host cost (``host-…`` cases, bf16 and fp16, every shape): each quantcore kernel that runs
here, called directly on its prepared state, and each module, called as a model calls it,
beside ``nn.Linear`` and ``F.linear`` on the same M, K, N in the same process
(:mod:`._host_cost`: the host's time per call over a queue of calls synchronised once, on
CUDA issued while a spin kernel holds the GPU, so that no call meets the device; the queue
issued to a running GPU and its wall time per call are in the note, and the median over
rounds of each round's time over nn.Linear's in the same round, :data:`PAIRED`, by which
the target is judged). Target on a
GPU: every kernel and module ≤ 1.3× ``nn.Linear``. On CUDA each ``graph-…`` case times the same calls as CUDA-graph replays
(what the GPU itself takes). Shape sets: ``default`` (a GPU: the paths' M buckets at
K = N = 4096), ``buckets`` (every M bucket of the Triton kernels), ``cpu`` (tiny: CI, where
the numbers are recorded, not judged).
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import torch

from quantcore.formats.gptq import GPTQ
from quantcore.problem import Problem
from quantcore.selection import get_kernel
from quantcore.timing import time_interleaved

from ..spec import BenchCase, Variant
from . import gptq_linear
from ._descriptors import DIFFER
from ._host_cost import host_samples, subjects

#: Never timed as a CUDA graph: it times subprocesses and host-side lookups.
GRAPH_SAFE = False
DESCRIPTION = "quantcore's own costs: import time and cached get_kernel"
SHAPES = {
    "default": [{"M": m, "K": 4096, "N": 4096} for m in (1, 16, 128, 1024)],
    "buckets": [{"M": m, "K": 4096, "N": 4096} for m in (1, 16, 32, 64, 128, 256, 1024, 2048, 4096)],
    "cpu": [{"M": m, "K": 128, "N": 256} for m in (1, 16)],
}
DTYPES = (torch.bfloat16, torch.float16)
#: The host-cost target: every kernel and module within this factor of nn.Linear's host time.
HOST_TARGET = 1.3
#: How a host case's note gives a subject's paired ratio to nn.Linear (:func:`paired_ratio`).
PAIRED = "× nn.Linear paired by round"
_PAIRED_RE = re.compile(r"([0-9.]+)" + re.escape(PAIRED))
#: Where the per-call cost shows (the op takes microseconds), then the issue's decode shape.
DISPATCH_SHAPES = ({"M": 1, "K": 128, "N": 256}, {"M": 1, "K": 4096, "N": 4096})


def _python(code: str) -> Any:
    return lambda i: subprocess.run([sys.executable, "-c", code], check=True)


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    yield _on_host_clock(BenchCase("overhead", "import", {}, [
        Variant("import quantcore", "kernel", _python("import quantcore, sys; assert 'triton' not in sys.modules"), 0, 0),
        Variant("python -c pass", "peer", _python("pass"), 0, 0),
        Variant("import torch", "peer", _python("import torch"), 0, 0),
    ]))
    dims = shapes[0]
    problem = Problem.linear(GPTQ(), M=dims["M"], K=dims["K"], N=dims["N"], dtype=torch.bfloat16)
    get_kernel("gptq", device, problem=problem)
    yield _on_host_clock(BenchCase("overhead", "get_kernel", dict(dims), [
        Variant("get_kernel (cached)", "kernel", lambda i: get_kernel("gptq", device, problem=problem), 0, 0),
        Variant("dict lookup", "peer", lambda i, d={problem: 1}: d[problem], 0, 0, note="hash of the Problem"),
    ]))
    if device == "cpu":
        for d in DISPATCH_SHAPES:
            case = gptq_linear.linear_case(
                "overhead", gptq_linear.FMT, gptq_linear.DTYPE, dict(d), device, gptq_linear.weights,
                gptq_linear.int4_bytes(d["M"], d["K"], d["N"]), gptq_linear.raw_op_peer,
            )
            case.variants = [v for v in case.variants if v.name in ("aten_cpu", "aten_op_raw")]
            yield case
    yield from host_cases(device, shapes)


def host_cases(device: str, shapes: list[dict[str, int]], dtypes: tuple[torch.dtype, ...] = DTYPES,
               rounds: int = 5) -> Iterator[BenchCase]:
    """Per dtype and shape: the host time per call of every kernel and module beside the
    dense peers (``host-…``), and on CUDA their CUDA-graph replay time (``graph-…``)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    for dtype in dtypes:
        tag = str(dtype).removeprefix("torch.")
        for dims in shapes:
            m, k, n = dims["M"], dims["K"], dims["N"]
            label = f"M{m}-K{k}-N{n}-{tag}"
            things, skipped = subjects(dev, dtype, m, k, n)
            with torch.inference_mode():
                timed = host_samples([s.fn for s in things], dev, rounds=rounds)
            base = next((t for s, t in zip(things, timed, strict=True) if s.name == "nn.Linear"), None)
            case = BenchCase("overhead", f"host-{label}", dict(dims), skipped=dict(skipped))
            for s, samples in zip(things, timed, strict=True):
                wall = statistics.median(samples.wall)
                paired = f"{samples.paired_ratio(base):.3f}{PAIRED}" if base is not None else ""
                running = (f"issued to a running GPU {statistics.median(samples.host) * 1e6:.1f} µs per call"
                           if samples.held else "")
                note = "; ".join(x for x in (s.kind, s.note, running, f"wall {wall * 1e6:.1f} µs per call", paired)
                                 if x)
                case.variants.append(Variant(s.name, "peer" if s.kind == "dense" else "kernel", _never, 0, 0,
                                             note=note, measured=samples.timing()))
            yield case
            if dev.type == "cuda":
                graph = BenchCase("overhead", f"graph-{label}", dict(dims), skipped=dict(skipped))
                graph.skipped.update({s.name: s.no_graph for s in things if s.no_graph})
                capturable = [s for s in things if not s.no_graph]
                with torch.inference_mode():
                    replays = time_interleaved([s.captured for s in capturable], device, rounds=rounds, graph=True)
                for s, timing in zip(capturable, replays, strict=True):
                    if timing.method != "cuda-graph":
                        graph.skipped[s.name] = timing.note or "not captured"
                        continue
                    graph.variants.append(Variant(s.name, "peer" if s.kind == "dense" else "kernel", _never, 0, 0,
                                                  note=s.kind, measured=timing))
                yield graph
            del things, timed


def _on_host_clock(case: BenchCase, rounds: int = 5) -> BenchCase:
    """Times what runs on the host alone (a subprocess, a lookup) with the host's clock on
    every device: CUDA events around it would time nothing on the GPU."""
    timings = time_interleaved([v.fn for v in case.variants], "cpu", rounds=rounds)
    for v, t in zip(case.variants, timings, strict=True):
        v.measured = t
    return case


def _never(i: int) -> object:
    raise AssertionError("host-cost variants are timed by the suite, not by the runner")


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    t = {(r["case"], r["variant"]): r["time_s"] for r in rows if r["role"] != "skipped"}
    notes = []
    if ("import", "import quantcore") in t:
        own = t["import", "import quantcore"] - t["import", "python -c pass"]
        notes += [
            f"import quantcore: {own * 1e3:.1f} ms over a bare interpreter (target ≤ 500 ms; triton not imported)",
            f"get_kernel, cached: {t['get_kernel', 'get_kernel (cached)'] * 1e6:.2f} µs (target ≤ 5 µs)",
        ]
    small, large = ("M{M}-K{K}-N{N}".format(**d) for d in DISPATCH_SHAPES)
    if (small, "aten_cpu") in t and (large, "aten_op_raw") in t:
        per_call = t[small, "aten_cpu"] - t[small, "aten_op_raw"]
        notes.append(
            f"aten_cpu through quantcore: {per_call * 1e6:+.1f} µs per call over the raw op ({small}), "
            f"{100 * per_call / t[large, 'aten_op_raw']:+.2f}% of the raw op at {large} (target ≤ +3%)"
        )
    notes += host_notes(rows)
    return notes


def paired_ratio(row: dict[str, Any]) -> float | None:
    """A host row's paired ratio to nn.Linear (:data:`PAIRED`), if its note has one."""
    found = _PAIRED_RE.search(row.get("note", ""))
    return float(found.group(1)) if found else None


def host_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Per host case: nn.Linear's host µs and each kernel and module against it (target
    ≤ 1.3× on a GPU), and any kernel whose descriptors-per-call twin computed another
    output; per graph case the replay µs."""
    notes = []
    for case in dict.fromkeys(r["case"] for r in rows if r["case"].startswith(("host-", "graph-"))):
        notes += [f"{case}: {r['variant']}: {DIFFER}" for r in rows
                  if r["case"] == case and case.startswith("host-") and DIFFER in r.get("note", "")]
        kernels = [r for r in rows if r["case"] == case and r["role"] == "kernel"]
        mine = {r["variant"]: r["time_s"] for r in kernels}
        dense = {r["variant"]: r["time_s"] for r in rows if r["case"] == case and r["role"] == "peer"}
        if "nn.Linear" not in dense:
            continue
        base = dense["nn.Linear"]
        # Host cases judge by the paired ratio where the row has one (older results: the
        # ratio of the medians).
        ratio = {r["variant"]: paired_ratio(r) or r["time_s"] / base for r in kernels}
        parts = ", ".join(f"{name} {v * 1e6:.1f} µs ({ratio[name]:.2f}×)" for name, v in mine.items())
        if case.startswith("host-"):
            over = [name for name in mine if ratio[name] > HOST_TARGET]
            verdict = f"over {HOST_TARGET}×: {', '.join(over)}" if over else f"all within {HOST_TARGET}×"
            notes.append(f"{case}: nn.Linear {base * 1e6:.1f} µs host per call; {verdict}; {parts}")
        else:
            notes.append(f"{case}: nn.Linear replay {base * 1e6:.1f} µs; {parts}")
    return notes
