"""Timing one callable: medians, interleaved rounds, device-appropriate clocks.

CUDA: ``triton.testing.do_bench`` (CUDA events; it also flushes L2 before each call)
with ``return_mode="median"``; CUDA events directly when triton is missing. With
``graph=True``, CUDA-graph replays instead: each callable is captured once, looping over
its rotating input sets (which together exceed L2, so no flush is needed), and the replay
is timed with events — the way decode runs in serving engines, and the only way to see a
few-microsecond kernel whose eager launch costs more host time than its GPU time. CPU:
``time.perf_counter`` around batches long enough to dwarf the clock's resolution.
Variants are timed in interleaved rounds and each keeps the median of its rounds, so
drift on a shared machine hits all of them alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["Timing", "time_interleaved"]

CPU_SAMPLE_S = 0.02
CPU_WARMUP_S = 0.1


@dataclass(frozen=True)
class Timing:
    median_s: float
    #: Spread of the round medians, (max − min) / median: what a difference must exceed.
    spread: float
    rounds: int
    #: "cuda-graph", "do_bench", "events" or "perf_counter"; "do_bench" after a failed capture.
    method: str = ""
    note: str = ""


def _cpu_sample(fn: Callable[[int], object], calls: int, start: int) -> float:
    t0 = time.perf_counter()
    for i in range(start, start + calls):
        fn(i)
    return (time.perf_counter() - t0) / calls


def _cpu_calibrate(fn: Callable[[int], object]) -> int:
    """Warm up, then pick a batch size so one sample lasts about CPU_SAMPLE_S."""
    t_end, calls, i = time.perf_counter() + CPU_WARMUP_S, 0, 0
    while time.perf_counter() < t_end or calls < 3:
        fn(i)
        i += 1
        calls += 1
    per_call = _cpu_sample(fn, 3, i)
    return max(1, int(CPU_SAMPLE_S / max(per_call, 1e-9)))


def _cuda_sample(fn: Callable[[int], object], state: list[int]) -> float:
    def call() -> None:
        fn(state[0])
        state[0] += 1

    try:
        from triton.testing import do_bench
    except ImportError:
        return _cuda_events(call)
    return float(do_bench(call, warmup=25, rep=100, return_mode="median")) / 1e3


def _cuda_events(call: Callable[[], None], reps: int = 50) -> float:
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


#: Calls captured per graph, at least: enough that one replay dwarfs the event resolution.
GRAPH_CALLS = 32


class _GraphReplay:
    """``fn(0) … fn(n−1)`` captured in one CUDA graph, ``n`` a multiple of ``sets``."""

    def __init__(self, fn: Callable[[int], object], sets: int, calls: int = GRAPH_CALLS) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in range(2 * sets):  # compile, autotune and allocate outside the capture
                fn(i)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.calls = sets * -(-calls // sets)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for i in range(self.calls):
                fn(i)
        torch.cuda.synchronize()

    def sample(self, replays: int = 10) -> float:
        self.graph.replay()
        times = []
        for _ in range(replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            self.graph.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3 / self.calls)
        return statistics.median(times)


def time_interleaved(
    fns: Sequence[Callable[[int], object]],
    device: str,
    rounds: int = 7,
    *,
    graph: bool = False,
    sets: Sequence[int] | None = None,
    graph_calls: int = GRAPH_CALLS,
) -> list[Timing]:
    """Median time per call of each ``fn``, measured round-robin. ``graph`` (CUDA only)
    times CUDA-graph replays of at least ``graph_calls`` calls each (fewer for a call that
    is itself long, such as a whole generation); ``sets[j]`` is how many input sets
    ``fns[j]`` rotates over."""
    samples: list[list[float]] = [[] for _ in fns]
    methods = ["perf_counter"] * len(fns)
    notes = [""] * len(fns)
    if device.startswith("cuda"):
        replays: list[_GraphReplay | None] = [None] * len(fns)
        if graph:
            for j, (fn, n) in enumerate(zip(fns, sets or [1] * len(fns), strict=True)):
                try:
                    replays[j] = _GraphReplay(fn, n, graph_calls)
                except Exception as exc:  # not capturable (host sync, side streams): time it eagerly
                    torch.cuda.synchronize()
                    notes[j] = f"eager: graph capture failed ({type(exc).__name__})"
        states = [[0] for _ in fns]
        for _ in range(rounds):
            for j, fn in enumerate(fns):
                replay = replays[j]
                samples[j].append(replay.sample() if replay is not None else _cuda_sample(fn, states[j]))
        methods = ["cuda-graph" if r is not None else "do_bench" for r in replays]
        del replays
    else:
        batch = [_cpu_calibrate(fn) for fn in fns]
        for r in range(rounds):
            for j, fn in enumerate(fns):
                samples[j].append(_cpu_sample(fn, batch[j], r * batch[j]))
    out = []
    for s, method, note in zip(samples, methods, notes, strict=True):
        med = statistics.median(s)
        out.append(Timing(med, (max(s) - min(s)) / med if med > 0 else 0.0, len(s), method, note))
    return out
