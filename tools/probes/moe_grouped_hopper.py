"""An MoE's routed GEMM on ``hopper_wgmma``'s kernel in one grouped launch
(``moe_grouped_kernel.py``), beside what runs it today (an sm_90 GPU, one call).

E = 8 experts, top-2, 4096 × 28672, ``trtllm_moe`` INT8 g128 symmetric weights with bf16
scales (the ``trtllm_moe`` suite's), bf16; the same weights prepared for each kernel
(``backends/hopper_wgmma/moe_layout.py`` for the grouped launch). Per T:

* checked, with each expert's last tile at the plan's width and, split off, at half of it
  (a second launch): the grouped launch, each row stored at its route's place, against
  each expert's plain ``hopper_wgmma`` launch over its own rows with the same plan (bit for
  bit where the tiles are the same) and against the float64 golden of the dequantized
  weights;
* timed (CUDA-graph replays, one process): the grouped launch on sorted rows (the peer's
  terms: the sort not timed) and the whole routed op (the schedule, the gathered rows, the
  launches storing each row at its route's place), both tail choices; one plain launch per
  expert on the sorted rows, ``trtllm_moe_triton`` on the same routing, and bf16 cuBLAS per
  expert (``benchmarks/suites/trtllm_moe.py``'s peer);
* the FFN's first GEMM with its SwiGLU in the epilogue (the experts' columns put in
  ``gated_columns``' order), at the table's plan with split tails: checked against the
  float64 SwiGLU of each expert's product, timed beside ``trtllm_moe_triton``'s own.

    python -m tools.probes.moe_grouped_hopper [--ts 512,4096] [--plans "2,128,4,1,in_flight,ws;…"] --json PATH

``--plans`` as ``hopper_plan_times``; the table's plan for the rows an expert gets is always
timed (split 1). ``--compile`` compiles the plans for sm_90a here instead (no GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch

from quantcore.backends.hopper_wgmma.launch import linear, plan_of, prepare_x
from quantcore.backends.hopper_wgmma.moe_layout import TRTLLMMoEToHopper
from quantcore.backends.hopper_wgmma.plans import Plan
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.registry import default_registry

from .hopper_plan_times import parse_plan
from .moe_grouped_kernel import GroupedExperts, gated_columns, grouped_kernel
from .moe_grouped_schedule import Schedule, schedule

E, TOPK, K, N = 8, 2, 4096, 28672
FMT = TRTLLMMoE(group_size=128, sym=True, scale_dtype=torch.bfloat16)


def compile_grouped(plan: Plan, *, scatter: bool = False, gated: bool = False, k: int = 512,
                    n: int = 256) -> dict[str, Any]:
    """The grouped kernel of ``plan`` compiled for sm_90a here: registers, spill stack,
    shared memory, HGMMAs, and the writes to a register an in-flight HGMMA reads."""
    from triton.runtime.jit import mangle_type

    from quantcore.triton.compile_report import compile_sm90

    from .hopper_wgmma_hazards import operand_hazards

    gen = torch.Generator().manual_seed(0)
    experts = TRTLLMMoEToHopper(FMT).apply(_weights(2, k, n, gen))
    grouped = GroupedExperts.stack(experts, plan)
    x = prepare_x(torch.zeros(64, k, dtype=torch.bfloat16))
    sched = schedule(torch.randint(0, 2, (64,), generator=gen), 2, plan.bm, grouped.n_tiles)
    _, args = grouped.args(x, sched.main, sched.order, torch.zeros(64, n, dtype=torch.bfloat16))
    const = {**grouped.const, "SCATTER": scatter, "GATED": gated}
    names = [a for a in grouped_kernel.arg_names if a not in const]
    signature = {name: mangle_type(a) for name, a in zip(names, args, strict=True)}
    compiled = compile_sm90(grouped_kernel, signature, const, divisible=[], options={"num_warps": plan.num_warps},
                            gluon=True)
    return {"plan": dataclasses.asdict(plan), "scatter": scatter, "gated": gated, "registers": compiled.registers,
            "spill_stack": compiled.spill_stack, "shared": compiled.shared, "hgmma": compiled.sass.count("HGMMA."),
            "hazards": len(operand_hazards(compiled.sass))}


def _weights(e: int, k: int, n: int, gen: torch.Generator, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Random codes and scales of the format (the suite's draw)."""
    return {"qweight": torch.randint(-128, 128, (e, k, n), dtype=torch.int8, generator=gen, device=device),
            "scales": (torch.rand(e, FMT.num_groups(k), n, generator=gen, device=device) * 2e-4 + 1e-4)
            .to(FMT.scale_dtype)}


def _segments(ids: torch.Tensor) -> list[tuple[int, int, int]]:
    counts = torch.bincount(ids.reshape(-1).long(), minlength=E).tolist()
    out, start = [], 0
    for e, c in enumerate(counts):
        if c:
            out.append((e, start, start + c))
        start += c
    return out


def _check(grouped: GroupedExperts, x: torch.Tensor, sched: Schedule, segments: list[tuple[int, int, int]],
           prepared: list[Any], dense: torch.Tensor) -> dict[str, Any]:
    """The grouped launch (rows in route order) against one plain launch of the same plan
    per expert, bit for bit, and against the float64 golden of each expert."""
    x_sorted = x.index_select(0, sched.order // TOPK)
    y = grouped(x_sorted, sched, route_order=True)[sched.order]
    same, worst = True, 0.0
    for e, a, b in segments:
        mine = y[a:b]
        plain = linear(x_sorted[a:b], prepared[e], dataclasses.replace(grouped.plan, split=1))
        same &= bool(torch.equal(mine, plain))
        golden = x_sorted[a:b].double() @ dense[e]
        worst = max(worst, float((mine.double() - golden).norm() / golden.norm()))
    return {"bit_identical_to_plain_launches": same, "rel_error_vs_golden": worst}


@dataclasses.dataclass
class _Setup:
    """What every T of a run shares: the experts prepared for the grouped launch (plain, and
    with their columns in the gated epilogue's order), the same weights for the kernel
    beside it and for cuBLAS, and their float64 dequantization."""

    prepared: list[Any]
    grouped: GroupedExperts
    gated: GroupedExperts
    moe: Any  # (x, ids) -> the routed GEMM of trtllm_moe_triton
    moe_gated: Any  # (x, ids) -> its GEMM and SwiGLU
    golden_w: torch.Tensor  # [E, K, N] float64
    dense: list[torch.Tensor]  # [E, N, K] bf16, for cuBLAS
    gen: torch.Generator


def run(ts: list[int], plans: list[str]) -> dict[str, Any]:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    src = _weights(E, K, N, gen, "cuda")
    order = gated_columns(N).to(dev)
    prepared = TRTLLMMoEToHopper(FMT).apply(src)
    gated = TRTLLMMoEToHopper(FMT).apply({name: t[:, :, order] for name, t in src.items()})
    moe: Any = default_registry().kernel(FMT.name, "moe", "trtllm_moe_triton").cls(FMT, dev)
    moe_w = moe.prepare(src, dtype=torch.bfloat16)
    forward = moe.forward  # the call without validating the ids (the suite's)
    golden_w = FMT.dequantize(src)
    plan = Plan(1, 128, 4, 1, in_flight=True)  # each launch takes its own: the experts are stacked once
    setup = _Setup(prepared, GroupedExperts.stack(prepared, plan), GroupedExperts.stack(gated, plan),
                   lambda x, ids: forward(x, ids, moe_w), lambda x, ids: forward(x, ids, moe_w, gated=True),
                   golden_w, [golden_w.transpose(1, 2).to(torch.bfloat16).contiguous()], gen)
    del gated
    rows: list[dict[str, Any]] = []
    for t in ts:
        rows += _one_t(t, plans, setup)
    return {"device": torch.cuda.get_device_name(), "E": E, "topk": TOPK, "K": K, "N": N, "format": FMT.slug,
            "rows": rows}


def _one_t(t: int, plans: list[str], setup: _Setup) -> list[dict[str, Any]]:
    from benchmarks.suites.trtllm_moe import _per_expert_peer, _routing
    from quantcore.timing import time_interleaved

    dev = setup.dense[0].device
    ids = _routing(t, E, TOPK, dev, setup.gen)
    x = torch.randn(t, K, device=dev, generator=setup.gen).to(torch.bfloat16)
    segments = _segments(ids)
    table = plan_of(t * TOPK // E, setup.prepared[0], dev)
    candidates = [dataclasses.replace(table, split=1, in_flight=True)] if isinstance(table, Plan) else []
    candidates += [parse_plan(p) for p in plans]
    rows: list[dict[str, Any]] = []
    names: list[str] = []
    calls: list[Any] = []

    def checked(name: str, check: Any) -> bool:
        try:
            result = check()
        except Exception as exc:  # a plan that fails is a row, not the end of the probe
            rows.append({"T": t, "variant": name, "error": f"{type(exc).__name__}: {exc}"})
            print(f"  T{t} {name}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
            return False
        rows.append({"T": t, "variant": name, **result})
        print(f"  T{t} {name}: {result}", file=sys.stderr, flush=True)
        return True

    for plan in dict.fromkeys(candidates):
        grouped = setup.grouped.with_plan(plan)
        for tail in (False, True):
            sched = schedule(ids, E, plan.bm, grouped.n_tiles, split_tail=tail)
            name = f"{plan}{', split tail' if tail else ''}"
            if not checked(f"grouped {name}", lambda g=grouped, s=sched: _check(g, x, s, segments, setup.prepared,
                                                                                 setup.golden_w)):
                continue
            x_sorted = x.index_select(0, sched.order // TOPK)
            names += [f"grouped, sorted rows: {name}", f"grouped, whole routed op: {name}"]
            calls += [lambda i, g=grouped, xs=x_sorted, s=sched: g(xs, s), _whole(grouped, x, ids, tail)]
        names.append(f"hopper_wgmma per expert: {plan}")
        sched = schedule(ids, E, plan.bm, grouped.n_tiles)
        calls.append(_per_expert(x.index_select(0, sched.order // TOPK), segments, setup.prepared,
                                 dataclasses.replace(plan, split=1)))
    if candidates:  # the FFN's first GEMM with its SwiGLU in the epilogue, the table's plan
        gated = setup.gated.with_plan(candidates[0])
        sched = schedule(ids, E, gated.plan.bm, gated.n_tiles, split_tail=True)
        if checked(f"grouped gated {gated.plan}, split tail",
                   lambda: _check_gated(gated, x, sched, segments, setup.golden_w)):
            names.append(f"grouped gated, whole routed op: {gated.plan}, split tail")
            calls.append(_whole(gated, x, ids, True, gated=True))
    names += ["trtllm_moe_triton", "trtllm_moe_triton gated", "bf16 per-expert cuBLAS"]
    calls += [lambda i: setup.moe(x, ids), lambda i: setup.moe_gated(x, ids),
              _per_expert_peer([x], ids, setup.dense)]
    times = time_interleaved(calls, "cuda", rounds=5, graph=True, sets=[1] * len(calls))
    for name, tm in zip(names, times, strict=True):
        rows.append({"T": t, "variant": name, "us": tm.median_s * 1e6, "spread": tm.spread})
        print(f"  T{t} {name}: {tm.median_s * 1e6:.1f} us", file=sys.stderr, flush=True)
    return rows


def _check_gated(grouped: GroupedExperts, x: torch.Tensor, sched: Schedule, segments: list[tuple[int, int, int]],
                 golden_w: torch.Tensor) -> dict[str, Any]:
    """The gated launch against the float64 SwiGLU of each expert's product."""
    from quantcore.ops.moe.reference import swiglu

    x_sorted = x.index_select(0, sched.order // TOPK)
    y = grouped(x_sorted, sched, route_order=True, gated=True)[sched.order]
    worst = 0.0
    for e, a, b in segments:
        golden = swiglu(x_sorted[a:b].double() @ golden_w[e])
        worst = max(worst, float((y[a:b].double() - golden).norm() / golden.norm()))
    return {"rel_error_vs_golden": worst}


def _whole(grouped: GroupedExperts, x: torch.Tensor, ids: torch.Tensor, split_tail: bool, *,
           gated: bool = False) -> Any:
    """The routed op: the schedule, the gathered rows, the launches storing each row at its
    route's place."""
    def run(i: int) -> torch.Tensor:
        sched = schedule(ids, E, grouped.plan.bm, grouped.n_tiles, split_tail=split_tail)
        return grouped(x.index_select(0, sched.order // TOPK), sched, route_order=True, gated=gated)
    return run


def _per_expert(x_sorted: torch.Tensor, segments: list[tuple[int, int, int]], prepared: list[Any], plan: Plan) -> Any:
    """One plain launch per expert over its sorted rows (the row counts known on the host)."""
    return lambda i: [linear(x_sorted[a:b], prepared[e], plan) for e, a, b in segments]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ts", default="512,4096")
    ap.add_argument("--plans", default="")
    ap.add_argument("--json")
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    plans = [p for p in args.plans.split(";") if p]
    if args.compile:
        out: Any = [compile_grouped(parse_plan(p), scatter=scatter, gated=gated) for p in plans
                    for scatter, gated in ((False, False), (True, False), (True, True))]
    else:
        out = run([int(v) for v in args.ts.split(",")], plans)
    text = json.dumps(out, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    print(text[-4000:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
