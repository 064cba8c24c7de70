"""Timing inside a tensor-parallel group: every rank runs the same calls in lockstep.
:func:`bench_rank` is the rank entry the ``tp_linear`` suite launches
(:func:`quantcore.checkpoint.launch.launch`).

A collective makes ranks wait for each other, so they must issue the same calls in the
same order; :func:`~quantcore.timing.time_interleaved` calibrates each
process on its own and would not. Here rank 0 calibrates, the group agrees on the call
count (an all-reduce of it), and every round starts at a barrier; a round's time is the
slowest rank's (what the block costs the group), the result the median of the rounds.

Variants (a ``solo`` one runs on rank 0 alone while the others wait, with all the
group's CPU threads): ``tpW_mlp`` the block with its all-reduce; ``tpW_local`` the same
without it (this rank's compute); ``all_reduce`` the collective alone on the block's
``[M, hidden]`` output; ``unsharded_mlp`` the whole block unsharded on one rank (the same
kernels, no process group; ``unsharded_mlp_unfused`` with gate and up as two launches); ``dense_bf16_mlp`` the dense block in bf16 on one rank.
``tpW_mlp`` and ``all_reduce`` run the process group's own all-reduce; ``tpW_mlp_one_shot``
and ``all_reduce_one_shot`` the same with torch's one-shot kernel over symmetric memory
(:mod:`quantcore.checkpoint.allreduce`; skipped with the reason where it cannot run), and
each case records which of the two ``"auto"`` picks for its M (``auto``).
The block fuses gate and up into one launch per rank (``ParallelQuantMLP``'s default);
``tpW_mlp_unfused`` and ``tpW_local_unfused`` time the same block built with
``fuse_gate_up=False`` (two launches), in the same run, for the difference.

With ``--graph`` (CUDA) each variant is also timed as engines run decode: every rank
captures the same calls in one CUDA graph (the all-reduce included: NCCL collectives are
captured; a gloo one is not, and that variant says so) and the group replays them in
lockstep; those rows are ``mode: "graph"``, the others ``"eager"``.

With ``--host`` (CUDA) each variant, and the block's parts (``tpW_gate_up`` the gate/up
layer's call, ``tpW_hidden`` that and the activation, ``tpW_down`` the down layer's
call), is timed for what its eager call costs the host alone (``mode: "host"``): each
round a spin kernel holds the GPU while every rank issues a few calls, so none of them
waits for the GPU and the time to issue them is the host's (a call that does wait — a
hidden synchronisation — shows as the spin's length).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ENTRY", "bench_rank"]

ENTRY = "quantcore.benchmarks.tp_timing:bench_rank"

#: Seconds one round of calls should last.
ROUND_S = {"cpu": 0.05, "cuda": 0.02}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _control(device: torch.device, backend: str) -> torch.device:
    """Where small control tensors live: NCCL needs them on the GPU, gloo takes the CPU."""
    return device if backend == "nccl" else torch.device("cpu")


def _seconds_per_call(fn: Callable[[int], object], device: torch.device, calls: int = 3) -> float:
    """Seconds per call of ``fn`` (already warm) over ``calls`` calls, the device drained
    before and after: rank 0's calibration of the call count."""
    _sync(device)
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    _sync(device)
    return (time.perf_counter() - t0) / calls


def _agreed(count: int, ctl: torch.device) -> int:
    """The call count the group agrees on: the largest any rank proposes."""
    import torch.distributed as dist

    calls = torch.tensor([count], device=ctl)
    dist.all_reduce(calls, op=dist.ReduceOp.MAX)
    return int(calls.item())


def _rounds(run: Callable[[int], object], n: int, rounds: int, ctl: torch.device) -> tuple[float, float]:
    """(median seconds per call, spread) over ``rounds`` rounds of ``run(round)``, each
    issuing ``n`` calls: every round starts at a barrier and takes the slowest rank's time."""
    import torch.distributed as dist

    samples = []
    for r in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        run(r)
        took = torch.tensor([(time.perf_counter() - t0) / n], dtype=torch.float64, device=ctl)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        samples.append(float(took.item()))
    med = statistics.median(samples)
    return med, (max(samples) - min(samples)) / med if med > 0 else 0.0


def lockstep(fn: Callable[[int], object], device: torch.device, backend: str, rounds: int, *, solo: bool) -> tuple[float, float]:
    """(median seconds per call, spread) of ``fn`` timed in lockstep over the group."""
    import torch.distributed as dist

    rank = dist.get_rank()
    runs = rank == 0 or not solo
    per_call = 0.0
    if runs:
        for i in range(3):
            fn(i)
        per_call = _seconds_per_call(fn, device)
    ctl = _control(device, backend)
    n = _agreed(max(1, int(ROUND_S.get(device.type, 0.05) / max(per_call, 1e-7))) if rank == 0 else 1, ctl)

    def run(r: int) -> None:
        if runs:
            for i in range(n):
                fn(r * n + i)
            _sync(device)

    return _rounds(run, n, rounds, ctl)


#: Calls captured in one graph: at least enough that a replay dwarfs its launch; at most
#: what keeps a capture quick.
GRAPH_CALLS = (8, 200)


def lockstep_graph(fn: Callable[[int], object], device: torch.device, backend: str, rounds: int, *,
                   solo: bool) -> tuple[float, float]:
    """(median seconds per call, spread) of ``fn`` captured in one CUDA graph per rank and
    replayed in lockstep: the ranks agree on the call count, capture together (a
    collective in ``fn`` is captured on every rank alike) and replay at each barrier."""
    import torch.distributed as dist

    rank = dist.get_rank()
    runs = rank == 0 or not solo
    per_call = 0.0
    if runs:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for i in range(3):  # compile, bind and allocate outside the capture
                fn(i)
        torch.cuda.current_stream(device).wait_stream(side)
        per_call = _seconds_per_call(fn, device)
    lo, hi = GRAPH_CALLS
    ctl = _control(device, backend)
    n = _agreed(min(hi, max(lo, int(ROUND_S["cuda"] / max(per_call, 1e-7)))) if rank == 0 else lo, ctl)
    graph = None
    if runs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for i in range(n):
                fn(i)
        graph.replay()
        _sync(device)

    def replay(r: int) -> None:
        if graph is not None:
            graph.replay()
            _sync(device)

    return _rounds(replay, n, rounds, ctl)  # the graph (and its memory pool) goes with this frame


#: Calls each rank issues per round of the host mode: few enough that their launches fit
#: the device's queue (about a thousand entries), so none waits for the GPU to drain it.
HOST_CALLS = 32
#: GPU clock cycles the host mode's spin kernel lasts (tens of milliseconds): longer than
#: issuing ``HOST_CALLS`` calls of any variant takes.
SPIN_CYCLES = 100_000_000


def lockstep_host(fn: Callable[[int], object], device: torch.device, backend: str, rounds: int, *,
                  solo: bool) -> tuple[float, float]:
    """(median host seconds per call, spread) of ``fn`` in eager: each round a spin kernel
    holds the GPU while the ranks issue ``HOST_CALLS`` calls, timed to the last one issued
    (the device is drained after, with the round's all-reduce of the times)."""
    import torch.distributed as dist

    runs = dist.get_rank() == 0 or not solo
    if runs:
        for i in range(3):
            fn(i)
        _sync(device)

    def issue(r: int) -> None:
        if runs:
            torch.cuda._sleep(SPIN_CYCLES)
            for i in range(HOST_CALLS):
                fn(r * HOST_CALLS + i)

    timed = _rounds(issue, HOST_CALLS, rounds, _control(device, backend))
    _sync(device)
    return timed


class _OneShotBlock(torch.nn.Module):
    """``mlp``'s rank-local block summed by the one-shot all-reduce of ``group``: the block
    :class:`~quantcore.nn.graphed.GraphedEager` replays with that all-reduce in its graphs."""

    def __init__(self, mlp: torch.nn.Module, group: Any) -> None:
        super().__init__()
        self.mlp, self.group = mlp, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.mlp.partial(x))  # type: ignore[operator]


def _stored_bytes(module: Any) -> int:
    return sum(t.numel() * t.element_size() for s in module.shards() for t in s.tensors.values())


def _dense_block(hidden: int, inter: int, device: torch.device, gated: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    gen = torch.Generator(device).manual_seed(0)  # drawn where it runs: a 70B-class block is 700 M weights
    w = [(torch.randn(inter, hidden, generator=gen, device=device) * 0.02).to(torch.bfloat16) for _ in range(2)]
    wd = (torch.randn(hidden, inter, generator=gen, device=device) * 0.02).to(torch.bfloat16)
    f = torch.nn.functional

    def block(x: torch.Tensor) -> torch.Tensor:
        h = f.silu(f.linear(x, w[0])) * f.linear(x, w[1]) if gated else f.silu(f.linear(x, w[1]))
        return f.linear(h, wd)

    return block


def _paths(tp: Any, max_tokens: int, hidden: int, dtype: torch.dtype, device: torch.device) -> tuple[Any, Any, str]:
    """The group again with the one-shot all-reduce and with ``"auto"``, their buffers made
    for ``max_tokens`` rows before any timing or capture (every rank alike), and why the
    one-shot path cannot run here ("" when it can)."""
    from quantcore.checkpoint.parallel import TPGroup
    from quantcore.errors import ShardError

    skip = ""
    one_shot = TPGroup(tp.rank, tp.world, tp.group, all_reduce_path="one_shot") if not tp.stage_on_host else None
    if one_shot is None:
        skip = "the group all-reduces a host copy (stage_on_host): no one-shot path"
    else:
        try:
            one_shot.prepare_all_reduce(max_tokens, hidden, dtype, device)
        except ShardError as exc:
            skip = str(exc)
    auto = TPGroup(tp.rank, tp.world, tp.group, tp.stage_on_host, all_reduce_path="auto")
    auto.prepare_all_reduce(max_tokens, hidden, dtype, device)
    return one_shot, auto, skip


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tp_linear rank")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--prefix", default="mlp")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--ms", default="1,16", help="activation rows, comma-separated")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--act-order", default="replicate", choices=("replicate", "groups"))
    p.add_argument("--graph", action="store_true", help="CUDA: also time every variant as CUDA-graph replays")
    p.add_argument("--host", action="store_true", help="CUDA: also time what every variant and part costs the host")
    p.add_argument("--stage-host", action="store_true",
                   default=os.environ.get("QUANTCORE_TP_STAGE_HOST") == "1",
                   help="all-reduce through a CPU copy (a backend without device tensors); also QUANTCORE_TP_STAGE_HOST=1")
    return p.parse_args(argv)


def bench_rank(ctx: Any, argv: list[str]) -> int:
    """Build this rank's block (every refusal before the rendezvous), join, time; rank 0
    writes ``bench.json``."""
    import torch.distributed as dist

    from quantcore.checkpoint import load_checkpoint
    from quantcore.checkpoint.parallel import ParallelQuantMLP, TPGroup
    from quantcore.dtypes import parse_dtype

    args = _args(argv)
    args.backend = ctx.backend
    # The block's own rows run the process group's all-reduce; the one-shot rows their own group.
    tp = TPGroup(ctx.rank, ctx.world, stage_on_host=args.stage_host, all_reduce_path="backend")
    ckpt = load_checkpoint(args.checkpoint)
    mlp, unfused = (ParallelQuantMLP.from_checkpoint(ckpt, args.prefix, tp, device=ctx.device, dtype=parse_dtype(args.dtype),
                                                     act_order=args.act_order, fuse_gate_up=fuse)
                    for fuse in (True, False))
    ctx.join()
    result = _bench(args, mlp, unfused, ctx.device, ctx.threads)
    if ctx.rank == 0:
        (ctx.out / "bench.json").write_text(json.dumps(result, indent=1))
    dist.barrier()
    return 0


def _bench(args: Any, mlp: Any, unfused: Any, device: torch.device, threads: int) -> dict[str, Any]:
    """Time the block (gate and up fused where they can be; ``unfused`` the same block with
    two launches) and its peers for every M of ``args.ms``; rank 0's return value is what
    the suite reads."""
    import torch.distributed as dist

    from quantcore.checkpoint import load_checkpoint
    from quantcore.checkpoint.parallel import ParallelQuantMLP, TPGroup
    from quantcore.dtypes import parse_dtype
    from quantcore.nn.graphed import GraphedEager

    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = parse_dtype(args.dtype)
    hidden, inter = mlp.down.local.out_features, mlp.down.shard.total
    gated = mlp.gated
    ms = [int(v) for v in args.ms.split(",")]
    one_shot, auto, one_shot_skip = _paths(mlp.tp, max(ms), hidden, dtype, device)
    whole = whole_unfused = dense = None
    if rank == 0:  # the one-rank peers, built before any timing so that no rank waits on a build
        ckpt = load_checkpoint(args.checkpoint)
        whole, whole_unfused = (ParallelQuantMLP.from_checkpoint(ckpt, args.prefix, TPGroup(0, 1), device=device,
                                                                 dtype=dtype, act_order=args.act_order,
                                                                 fuse_gate_up=fuse)
                                for fuse in (True, False))
        dense = _dense_block(hidden, inter, device, gated)
    ctl = _control(device, args.backend)
    total = torch.tensor([_stored_bytes(mlp)], dtype=torch.float64, device=ctl)
    dist.all_reduce(total)
    quant_bytes = int(total.item())
    kernels = mlp.kernels()
    # Eager calls replayed from a CUDA graph per row bucket (quantcore/nn/graphed.py).
    graphed = GraphedEager(mlp, max_rows=max(ms)) if device.type == "cuda" else None
    graphed_whole = GraphedEager(whole, max_rows=max(ms)) if device.type == "cuda" and whole is not None else None
    graphed_one_shot = (GraphedEager(_OneShotBlock(mlp, one_shot), max_rows=max(ms))
                        if device.type == "cuda" and not one_shot_skip else None)
    cases = []
    for m in ms:
        gen = torch.Generator().manual_seed(1 + m)
        xs = [torch.randn(m, hidden, generator=gen).to(device, dtype) for _ in range(4)]
        bufs = [torch.randn(m, hidden, generator=gen).to(device, dtype) for _ in range(4)]
        act = 2 * 2 * m * hidden  # x read, y written (bf16)
        flops = 2 * m * hidden * inter * (3 if gated else 2)
        dense_bytes = 2 * hidden * inter * (3 if gated else 2) + act
        variants: list[tuple[str, str, Callable[[int], object], bool, int, int, str]] = [
            (f"tp{world}_mlp", "kernel", lambda i, xs=xs: mlp(xs[i % 4]), False, quant_bytes + act, flops,
             f"{world} ranks, {args.backend}; bytes and flops of all ranks"),
            (f"tp{world}_local", "peer", lambda i, xs=xs: mlp.partial(xs[i % 4]), False, quant_bytes + act, flops,
             "the same without the all-reduce"),
            (f"tp{world}_mlp_unfused", "peer", lambda i, xs=xs: unfused(xs[i % 4]), False, quant_bytes + act, flops,
             f"gate and up as two launches per rank (fuse_gate_up=False); {args.backend} all-reduce"),
            (f"tp{world}_local_unfused", "peer", lambda i, xs=xs: unfused.partial(xs[i % 4]), False, quant_bytes + act,
             flops, "gate and up as two launches per rank, without the all-reduce"),
            ("all_reduce", "peer", lambda i, bufs=bufs: mlp.tp.all_reduce(bufs[i % 4]), False, 2 * m * hidden * dtype.itemsize, 0,
             f"{args.backend} all-reduce of the [M, hidden] output"),
            (f"tp{world}_mlp_one_shot", "kernel", lambda i, xs=xs: one_shot.all_reduce(mlp.partial(xs[i % 4])), False,
             quant_bytes + act, flops, "the block with the one-shot all-reduce (symmetric memory)"),
            ("all_reduce_one_shot", "peer", lambda i, bufs=bufs: one_shot.all_reduce(bufs[i % 4]), False,
             2 * m * hidden * dtype.itemsize, 0, "one-shot all-reduce (symmetric memory) of the [M, hidden] output"),
        ]
        if graphed is not None:
            with torch.no_grad():  # every rank captures its bucket here, before any timing
                graphed(xs[0])
                variants.append((f"tp{world}_mlp_graphed", "kernel", lambda i, xs=xs: graphed(xs[i % 4]), False,
                                 quant_bytes + act, flops,
                                 f"eager calls replayed from a CUDA graph per row bucket; {args.backend} all-reduce"))
        if graphed_one_shot is not None:
            with torch.no_grad():
                graphed_one_shot(xs[0])
                variants.append((f"tp{world}_mlp_graphed_one_shot", "kernel", lambda i, xs=xs: graphed_one_shot(xs[i % 4]),
                                 False, quant_bytes + act, flops,
                                 "eager calls replayed from a CUDA graph per row bucket; one-shot all-reduce"))
        hs = [mlp.hidden(x) for x in xs]
        parts: list[tuple[str, str, Callable[[int], object], bool, int, int, str]] = [
            (f"tp{world}_gate_up", "peer", lambda i, xs=xs: mlp.columns(xs[i % 4]) if mlp.gate_up is None
             else mlp.gate_up.local(xs[i % 4]), False, 0, 0, "the block's part: gate and up"),
            (f"tp{world}_hidden", "peer", lambda i, xs=xs: mlp.hidden(xs[i % 4]), False, 0, 0,
             "the block's part: gate and up, then the activation"),
            (f"tp{world}_down", "peer", lambda i, hs=hs: mlp.down.local(hs[i % 4]), False, 0, 0,
             "the block's part: down, without the all-reduce"),
        ]
        if rank == 0:
            variants += [
                ("unsharded_mlp", "peer", lambda i, xs=xs: whole(xs[i % 4]), True, quant_bytes + act, flops, "unsharded, one rank, no process group"),
                ("unsharded_mlp_unfused", "peer", lambda i, xs=xs: whole_unfused(xs[i % 4]), True, quant_bytes + act, flops,
                 "unsharded, gate and up as two launches"),
                ("dense_bf16_mlp", "peer", lambda i, xs=xs: dense(xs[i % 4]), True, dense_bytes, flops, "dense bf16, one rank"),
            ]
            if graphed_whole is not None:
                with torch.no_grad():
                    graphed_whole(xs[0])
                variants.append(("unsharded_mlp_graphed", "peer", lambda i, xs=xs: graphed_whole(xs[i % 4]), True,
                                 quant_bytes + act, flops, "unsharded, eager calls replayed from a CUDA graph"))
        else:
            noop: Callable[[int], object] = lambda i: None  # noqa: E731
            variants += [(name, "peer", noop, True, 0, 0, "")
                         for name in ("unsharded_mlp", "unsharded_mlp_unfused", "dense_bf16_mlp",
                                      *(["unsharded_mlp_graphed"] if graphed is not None else []))]
        rows = []
        cuda = device.type == "cuda"
        modes = ["eager", *(["graph"] if args.graph and cuda else []), *(["host"] if args.host and cuda else [])]
        with torch.no_grad():
            for mode in modes:
                for name, role, fn, solo, nbytes, nflops, note in variants + (parts if mode == "host" else []):
                    if mode != "eager" and "_graphed" in name:
                        why = ("inside a graph of its own the block runs itself: the graph row is its time"
                               if mode == "graph" else
                               "replays queued behind the spin kernel time the queue, not a call's host work "
                               "(2×H200: 1.6 ms a call with the all-reduce in the graph, 52-60 µs without)")
                        rows.append({"name": name, "role": "skipped", "mode": mode, "note": why})
                        continue
                    if name.endswith("_one_shot") and one_shot_skip:
                        rows.append({"name": name, "role": "skipped", "mode": mode, "note": one_shot_skip})
                        continue
                    if mode != "eager" and name in ("all_reduce", f"tp{world}_mlp", f"tp{world}_mlp_unfused") \
                            and args.backend != "nccl":
                        why = "not in a CUDA graph" if mode == "graph" else "it waits for the GPU"
                        rows.append({"name": name, "role": "skipped", "mode": mode,
                                     "note": f"a {args.backend} all-reduce runs on the host: {why}"})
                        continue
                    if solo and rank == 0:
                        torch.set_num_threads(threads * world)
                    timer = {"graph": lockstep_graph, "host": lockstep_host}.get(mode, lockstep)
                    t, spread = timer(fn, device, args.backend, args.rounds, solo=solo)
                    torch.set_num_threads(threads)
                    rows.append({"name": name, "role": role, "mode": mode, "time_s": t, "spread": spread,
                                 "bytes": nbytes, "flops": nflops, "note": note})
        cases.append({"M": m, "variants": rows, "auto": auto.all_reduce_path_for(m, hidden, dtype, device)})
    return {"world": world, "backend": args.backend, "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "threads_per_rank": threads, "kernels": kernels, "unfused_why": mlp.unfused_why,
            "hidden": hidden, "inter": inter, "cases": cases}
