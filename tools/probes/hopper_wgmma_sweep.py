"""One device call's worth of work for ``hopper_wgmma`` (an sm_90 GPU):

1. ``check``: every plan shape (1–2 warpgroups, 8–256 activation rows, split K or not,
   groups waited for at each block or left in flight, the latter also with a producer
   warp: ``Plan.ws``) on 4/8-bit, sym/asym, groups
   32/64/128/−1, act-order, v1, AWQ, bf16/fp16, bias, fp32/bf16 scales, and K and N
   that are not multiples of a block or tile, against the float64 golden output
   (``quantcore.ops``' tolerance); ``--repeat`` runs each cell again and records whether
   the outputs are bit-identical (a race shows as a difference).
2. ``warm``: compile what ``time`` will run (each shard of ``--shard i/n`` in its own
   process, so the compiles run side by side; Triton's cache keeps them).
3. ``time``: per (K, N) × M, candidate plans of ``hopper_wgmma`` and the peers (cuBLAS
   bf16, ``triton_int4``'s default, ``aten_cuda`` at small M, as ``--peers`` says) as
   CUDA-graph replays over rotating weights, interleaved; every timed plan's output is
   checked first (on up to 1024 sampled rows). At M ≤ 16 the candidates include
   :class:`~quantcore.backends.hopper_wgmma.plans.TritonPlan` s: Triton's tensor-core
   kernel (and at M ≤ 4 its GEMV) over the same prepared words (``small_m.py``), checked
   in ``check`` too.

    python -m tools.probes.hopper_wgmma_sweep --out DIR [--only check|warm|time] [--bits 4]

Writes ``DIR/check[-i-of-n].json``, ``DIR/time-<bits>-<dtypes>.json`` as it goes (a call
cut short keeps what was done) and prints a compact table last. On any machine,
``--table DIR/device.json DIR/time-*.json DIR/check.json --out FOLDER`` writes the
fastest plans as the backend's ``tuned-<card>.json`` — none of a kind (in flight, two
blocks per wait, warp-specialised, Triton) that the check found wrong or unrepeatable, no
warp-specialised one unless the check ran that kind, none that beats the plan the
call took by less than ``MARGIN`` — keeping the entries of an existing table of that card
that these timings did not measure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaAWQ, HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.launch import linear, plan_of
from quantcore.backends.hopper_wgmma.plans import (
    AnyPlan,
    DecodePlan,
    Plan,
    TritonPlan,
    gated_plan_refusal,
    plan_from_dict,
)
from quantcore.benchmarks.memory import with_fresh_codes
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.kernels.gptq_pairs.plans import pow2_at_least
from quantcore.ops.linear import linear_reference
from quantcore.ops.tolerance import judge_output
from quantcore.probe.card import CardKey, card_key
from quantcore.timing import time_interleaved

SHAPES = [(4096, 14336), (14336, 4096), (4096, 4096), (4096, 1024)]
#: Where the work runs: the probe is for an sm_90 GPU ("cpu" only to rehearse its logic
#: with a stand-in for the kernel).
DEVICE = "cuda"
MS = [1, 16, 32, 64, 128, 512, 2048, 8192]

CHECK_PLANS = [Plan(1, 8, 3, 1), Plan(1, 16, 4, 3, 2), Plan(1, 32, 2, 2), Plan(1, 64, 4, 1, 2),
               Plan(1, 128, 4, 2), Plan(2, 128, 4, 1, 2), Plan(2, 256, 3, 2)]
#: Groups left in flight: the tiles where waiting at each block's end was once the only
#: right answer (two warpgroups, 128 and 256 rows), the shallowest ring, split K.
IN_FLIGHT_PLANS = [Plan(1, 8, 3, 1, in_flight=True), Plan(1, 16, 4, 3, in_flight=True),
                   Plan(1, 64, 4, 2, in_flight=True), Plan(1, 128, 4, 1, in_flight=True),
                   Plan(2, 128, 4, 1, in_flight=True), Plan(2, 128, 3, 2, in_flight=True),
                   Plan(2, 256, 3, 1, in_flight=True), Plan(2, 256, 2, 2, in_flight=True)]

#: Triton plans over the same words (small_m.py), checked on every case: the tensor-core
#: kernel with K split and two blocks a step, the GEMV split.
TRITON_CHECK_PLANS = [TritonPlan("mma", 64, 16, split=3, block_b=2), TritonPlan("gemv", 32, split=2, block_b=2)]


def in_flight_twin(plan: Plan) -> Plan:
    """``plan``'s in-flight walk, its consumers issuing the loads (no producer warp)."""
    return dataclasses.replace(plan, per_wait=1, in_flight=True, ws=False)


def ws_twin(plan: Plan) -> Plan:
    """``plan``'s in-flight walk with a producer warp issuing the loads (``Plan.ws``)."""
    return dataclasses.replace(in_flight_twin(plan), ws=True)


def late_twins(plan: Plan) -> list[Plan]:
    """``plan``'s in-flight walk scaling late (``Plan.late_scale``), with and without a
    producer warp; the producer's twins capped at 80 and 128 registers a thread, so that
    more than one CTA fits an SM."""
    late = dataclasses.replace(in_flight_twin(plan), late_scale=True)
    return [late] + [dataclasses.replace(late, ws=True, maxnreg=r) for r in (80, 128)]


def capped_twins(m: int, k: int, n: int, bits: int) -> list[Plan]:
    """At M ≤ 16: one-warpgroup in-flight tiles capped at 64 registers a thread (8 CTAs an
    SM, where the compiler's 94 allow 5), K split so that up to 8 CTAs of each SM have work."""
    if m > 16:
        return []
    blocks = k // (512 // bits)
    bm = max(8, 1 << (m - 1).bit_length())
    return list(dict.fromkeys(Plan(1, bm, stages, min(split, blocks // 2), in_flight=True, maxnreg=REG_CAP)
                              for stages in (3, 4) for split in (2, 4, 6, 8)))


#: The register cap of :func:`capped_twins`: no spill at 8 or 16 rows (``hopper_wgmma_sass.py``).
REG_CAP = 64

#: The activation tiles where a late scale can pay: each block's fold costs BM/2 FMAs a
#: thread per accumulator, which the operand's saved multiplies cover up to 32 rows.
LATE_MAX_BM = 32


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if DEVICE == "cuda" else 132


def _run(kernel: Any, prepared: Any, x: torch.Tensor, plan: AnyPlan | None) -> torch.Tensor:
    """Through the kernel (its own plan) or, with ``plan``, through the launcher."""
    if plan is None:
        return kernel(x, prepared)
    x2 = x.index_select(1, prepared.ret_idx) if prepared.ret_idx is not None else x
    return linear(x2, prepared, plan)


def check_cases() -> list[dict[str, Any]]:
    g = GPTQ
    cases = [
        dict(fmt=g(bits=4, group_size=128), k=1024, n=384, plans=CHECK_PLANS, dtypes=("bf16", "fp16")),
        dict(fmt=g(bits=4, group_size=128, sym=False), k=1024, n=384, plans=CHECK_PLANS[:4] + CHECK_PLANS[6:],
             dtypes=("bf16", "fp16")),
        dict(fmt=g(bits=4, group_size=32, sym=False), k=512, n=256, plans=CHECK_PLANS[1::2], dtypes=("bf16",)),
        dict(fmt=g(bits=4, group_size=64), k=512, n=256, plans=CHECK_PLANS[1::2], dtypes=("fp16",)),
        dict(fmt=g(bits=4, group_size=-1), k=768, n=192, plans=CHECK_PLANS[::3], dtypes=("bf16",)),
        dict(fmt=g(bits=4, group_size=128, sym=False, desc_act=True), k=1024, n=256, plans=CHECK_PLANS[::2],
             dtypes=("bf16", "fp16")),
        dict(fmt=g(bits=4, group_size=128, checkpoint_format="v1", sym=False), k=512, n=128,
             plans=CHECK_PLANS[1:2], dtypes=("bf16",)),
        dict(fmt=g(bits=8, group_size=128), k=1024, n=384, plans=CHECK_PLANS, dtypes=("bf16", "fp16")),
        dict(fmt=g(bits=8, group_size=32, sym=False), k=512, n=256, plans=CHECK_PLANS[1::2], dtypes=("bf16", "fp16")),
        dict(fmt=g(bits=8, group_size=-1), k=640, n=192, plans=CHECK_PLANS[::3], dtypes=("fp16",)),
        dict(fmt=g(bits=8, group_size=64, desc_act=True), k=512, n=128, plans=CHECK_PLANS[1:3], dtypes=("bf16",)),
        # K not a multiple of the block (nor of 32), N not of the tile, with bias.
        dict(fmt=g(bits=4, group_size=32), k=1056, n=200, plans=CHECK_PLANS[:3] + CHECK_PLANS[5:6],
             dtypes=("bf16", "fp16"), bias=True),
        dict(fmt=g(bits=4, group_size=-1, sym=False), k=4104, n=72, plans=CHECK_PLANS[1:2] + CHECK_PLANS[5:6],
             dtypes=("bf16",), bias=True),
        dict(fmt=g(bits=8, group_size=32), k=1056, n=200, plans=CHECK_PLANS[1:2] + CHECK_PLANS[5:6],
             dtypes=("bf16",), bias=True),
        # Scales stored in other dtypes.
        dict(fmt=g(bits=4, group_size=128), k=1024, n=256, plans=CHECK_PLANS[1:2] + CHECK_PLANS[5:6],
             dtypes=("bf16",), scales=torch.float32),
        dict(fmt=g(bits=4, group_size=128), k=1024, n=256, plans=CHECK_PLANS[1:2], dtypes=("fp16",),
             scales=torch.bfloat16),
        dict(fmt=AWQ(bits=4, group_size=128), k=1024, n=384, plans=[None, *CHECK_PLANS[1::2]], dtypes=("bf16", "fp16")),
        dict(fmt=AWQ(bits=4, group_size=64, zero_point=False), k=512, n=256, plans=[None], dtypes=("fp16",)),
        # A longer walk (32 blocks) over more tiles, where a race has more chances.
        dict(fmt=g(bits=4, group_size=128), k=4096, n=1024, plans=CHECK_PLANS[4:], dtypes=("bf16",), ms=(300, 1000)),
    ]
    # Every in-flight plan on the main 4- and 8-bit cases and the long walk; elsewhere the
    # twins of two of the case's plans (the format's code paths, not the tiles, vary there).
    # Each in-flight plan also with its producer warp (ws), on the same cells.
    full = {0, 1, 7, len(cases) - 1}
    for ci, case in enumerate(cases):
        old = [p for p in case["plans"] if p is not None]
        new = IN_FLIGHT_PLANS if ci in full else [in_flight_twin(p) for p in old[:2]]
        new = new + [ws_twin(p) for p in new] + [t for p in new if p.bm <= LATE_MAX_BM for t in late_twins(p)]
        new = new + [dataclasses.replace(p, maxnreg=REG_CAP) for p in new if p.bm <= 16 and not p.ws and not p.late_scale]
        case["plans"] = case["plans"] + [p for p in dict.fromkeys(new) if p not in case["plans"]] + TRITON_CHECK_PLANS
    return cases


#: ``--focus late``: check only the late-scale plans, and time only the plan a call takes,
#: its in-flight twin and the late-scale candidates — one kind measured in one short call.
FOCUS: list[str] = []


def _focused(plan: AnyPlan | None) -> bool:
    if not FOCUS:
        return True
    return isinstance(plan, Plan) and (("late" in FOCUS and plan.late_scale)
                                       or ("regs" in FOCUS and plan.maxnreg == REG_CAP and not plan.late_scale))


def few_program_plans(m: int, k: int, n: int, bits: int, sms: int) -> list[Plan]:
    """From M = 32: K split only so far that the programs are half or all of the SMs, on a
    ring of four. Each split adds a partial sum through global memory, and where the tiles
    are few that sum, not the idle SMs, is what a call waits for (H200, 4096×1024 at
    M = 128: split 4 over 64-row tiles took 9.5 µs, split 8 13.5)."""
    if m <= 16:
        return []
    blocks = k // (512 // bits)
    tiles_n = -(-n // 64)
    out: list[Plan] = []
    for bm in dict.fromkeys((pow2_at_least(m, 32, 128), *((64,) if m >= 64 else ()))):
        tiles = tiles_n * -(-m // bm)
        for per_sm in (0.5, 1):
            plan = Plan(1, bm, 4, max(1, min(blocks // 2, round(per_sm * sms / tiles))), in_flight=True)
            if plan not in out:
                out.append(plan)
    return out


def _check_units(shard: tuple[int, int]) -> list[tuple[int, AnyPlan | None]]:
    """(case, plan) pairs of this shard: plans dealt round-robin, so every shard gets a
    share of the expensive ones."""
    units = [(ci, plan) for ci, case in enumerate(check_cases()) for plan in case["plans"] if _focused(plan)]
    i, n = shard
    return units[i::n]


def run_check(out: Path, shard: tuple[int, int] = (0, 1), repeat: int = 1) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    dev = torch.device(DEVICE)
    cases = check_cases()
    units = _check_units(shard)
    name = "check.json" if shard[1] == 1 else f"check-{shard[0]}-of-{shard[1]}.json"
    for ci in sorted({ci for ci, _ in units}):
        case = cases[ci]
        fmt, k, n = case["fmt"], case["k"], case["n"]
        gen = torch.Generator().manual_seed(1000 + ci)
        w = torch.randn(n, k, generator=gen) * 0.05
        stored = fmt.quantize(w, generator=gen) if isinstance(fmt, GPTQ) else fmt.quantize(w)
        if case.get("scales") is not None:
            stored = dict(stored, scales=stored["scales"].to(case["scales"]))
        if case.get("bias"):
            stored = dict(stored, bias=torch.randn(n, generator=gen).to(torch.float16))
        dense = fmt.dequantize(stored, torch.float64)
        cls = HopperWgmmaGPTQ if isinstance(fmt, GPTQ) else HopperWgmmaAWQ
        kernel = cls(fmt, dev)
        prepared = kernel.prepare({a: t.to(dev) for a, t in stored.items()})
        plans = [plan for cj, plan in units if cj == ci]
        for dname in case["dtypes"]:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dname]
            for m in case.get("ms", (1, 37, 300)):
                x = torch.randn(m, k, generator=gen).to(dtype)
                ref = linear_reference(x, dense, stored.get("bias"))
                for plan in plans:
                    row = {"fmt": fmt.slug, "k": k, "n": n, "m": m, "dtype": dname,
                           "scales": str(stored["scales"].dtype), "bias": bool(case.get("bias")),
                           "plan": plan.__dict__ if plan else "default"}
                    try:
                        ys = []
                        for _ in range(repeat):
                            ys.append(_run(kernel, prepared, x.to(dev), plan))
                            _sync()
                        judged = [judge_output(y, ref, dtype) for y in ys]
                        c = max(judged, key=lambda j: (not j.ok, j.rel_err))
                        row |= {"ok": all(j.ok for j in judged), "rel": c.rel_err, "max": c.max_err, "why": c.problem,
                                "repeats": repeat, "same": all(torch.equal(y, ys[0]) for y in ys)}
                    except Exception as exc:
                        row |= {"ok": False, "why": f"{type(exc).__name__}: {exc}"[:400],
                                "trace": traceback.format_exc()[-1500:]}
                    rows.append(row)
                    if not row["ok"]:
                        print("FAIL", json.dumps({a: b for a, b in row.items() if a != "trace"}), flush=True)
        (out / name).write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if not r["ok"]]
    differ = [r for r in rows if r["ok"] and not r.get("same", True)]
    print(f"check {shard[0]}/{shard[1]}: {len(rows) - len(bad)}/{len(rows)} within tolerance"
          f" ({repeat} runs each; {len(differ)} right but not bit-identical)", flush=True)
    return rows


def merge_checks(out: Path) -> list[dict[str, Any]]:
    """``check-*-of-*.json`` → ``check.json``, with a summary per kind of plan."""
    rows = [r for p in sorted(out.glob("check-*-of-*.json")) for r in json.loads(p.read_text())]
    (out / "check.json").write_text(json.dumps(rows, indent=1))
    for kind in ("waited", "two blocks per wait", "in flight", WS_KIND, LATE_KIND, "triton"):
        mine = [r for r in rows if isinstance(r["plan"], dict) and _kind(r["plan"]) == kind]
        ok = sum(r["ok"] for r in mine)
        same = sum(r.get("same", True) for r in mine)
        print(f"{kind}: {ok}/{len(mine)} within tolerance, {same} bit-identical across runs")
    print(f"all: {sum(r['ok'] for r in rows)}/{len(rows)}", flush=True)
    return rows


# --- timing --------------------------------------------------------------------------------


def triton_candidates(m: int, k: int, n: int, bits: int, sms: int) -> list[TritonPlan]:
    """Triton plans timed at M ≤ 16 (small_m.py): the tensor-core kernel's 16-row tile
    with 64 or 128 outputs per program and K split to about 2 or 5 programs per SM (the
    neighbourhood of triton_int4's tuned plans at these Ms, its 4096 × 4096 one first),
    one or two blocks a step, and 128 outputs split to about 4 an SM (8192 × 28672 at
    M = 16: K split in two, 49.9 µs against 56.6 unsplit on an H200); at M ≤ 4 also the GEMV."""
    if m > 16:
        return []
    blocks = k // (512 // bits)
    out: list[TritonPlan] = []
    for block_n, per_sm, block_b, stages in ((64, 5, 1, 4), (64, 5, 2, 3), (64, 2, 1, 3), (64, 2, 2, 3),
                                             (128, 5, 1, 3), (128, 4, 1, 3)):
        split = max(1, min(blocks // block_b, round(per_sm * sms / -(-n // block_n))))
        out.append(TritonPlan("mma", block_n, 16, split, 4, stages, block_b))
    if m <= 4:
        out += [TritonPlan("gemv", 16, split=1, block_b=4, stages=2),
                TritonPlan("gemv", 16, split=max(1, min(blocks // 4, round(2 * sms / -(-n // 16)))), block_b=4,
                           stages=2)]
    return list(dict.fromkeys(out))


def candidates(m: int, k: int, n: int, bits: int, sms: int, shipped: AnyPlan | None = None) -> list[AnyPlan]:
    """The plans timed at one point: the shipped one and its variants (two blocks per
    wait, groups in flight), then tiles around it, each waited for at every block and
    left in flight, each in-flight one also with its producer warp (:func:`ws_twin`);
    at M ≤ 16 also shallow rings (more CTAs resident per SM) and the
    Triton plans (:func:`triton_candidates`)."""
    blocks = k // (512 // bits)
    tiles_n = n // 64
    out: list[AnyPlan] = []

    def put(plan: AnyPlan) -> None:
        if plan not in out:
            out.append(plan)

    taken = shipped
    if isinstance(shipped, TritonPlan | DecodePlan):  # timed as it is: no wgmma variants of it
        put(shipped)
        shipped = None
    if shipped is not None:
        put(dataclasses.replace(shipped, per_wait=1, in_flight=False, ws=False))
        put(dataclasses.replace(shipped, per_wait=2, in_flight=False, ws=False))
        put(in_flight_twin(shipped))
        if shipped.ws:
            put(shipped)

    def add(wg: int, bm: int, stages: int, per_sm: list[float]) -> None:
        tiles = -(-tiles_n // wg) * -(-m // bm)
        for p in per_sm:
            split = max(1, min(blocks // 2, round(p * sms / tiles)))
            put(Plan(wg, bm, stages, split))
            put(Plan(wg, bm, stages, split, in_flight=True))

    if m <= 64:
        bm = max(16, 1 << (m - 1).bit_length())
        add(1, bm, 8 if bm <= 32 else 5, [1, 2, 4])
        add(1, bm, 4, [2, 4, 8])
        if m == 1:
            add(1, 8, 8, [2, 4])
            add(1, 8, 4, [4, 8])
        # Two consumer warpgroups: with a producer warp the faster tile at M = 64, and at
        # M = 1 on a large N over a short K (4096×14336 on an H100: 16.4 against 18.2 µs; at
        # 8 bits with a ring of 6, 25.1 against 30.7 µs, and 26.6 against 31.7 at M = 16).
        add(2, 8 if m == 1 else bm, 6 if bits == 8 else 4, [1, 2])
    elif m <= 128:
        add(1, 128, 3, [1, 2])
        add(2, 128, 4, [1, 2])
        add(1, 64, 6, [2, 4])
    else:
        add(2, 128, 4, [1, 2])
        add(1, 128, 3, [1])
        # Two warpgroups over 256 rows dequantize each weight half as often as over 128. At 8
        # bits (a stage holds half the K of 4 bits: a ring of 4) with a producer warp, the
        # faster tile on the large shapes from M = 512 (H200, 4096×14336: 104 against 150 µs).
        add(2, 256, 3 if bits == 4 else 4, [1, 2])
    for plan in few_program_plans(m, k, n, bits, sms):
        put(plan)
    for plan in [p for p in out if isinstance(p, Plan) and p.in_flight]:
        put(ws_twin(plan))
    if bits == 4:
        for plan in [p for p in out if isinstance(p, Plan) and p.in_flight and not p.ws and p.bm <= LATE_MAX_BM]:
            for twin in late_twins(plan):
                put(twin)
    for plan in triton_candidates(m, k, n, bits, sms):
        put(plan)
    if "regs" in FOCUS and bits == 4:
        for plan in capped_twins(m, k, n, bits):
            put(plan)
    if FOCUS:
        base: list[AnyPlan] = [] if taken is None else [taken]
        if isinstance(taken, Plan):
            base.append(in_flight_twin(taken))
        if "splits" in FOCUS:
            base += few_program_plans(m, k, n, bits, sms)
        return [p for p in out if p in base or _focused(p)]
    return out


def _points(bits: int, ms: list[int], shapes: list[tuple[int, int]], sms: int,
            shipped: Any) -> list[tuple[int, int, int, list[AnyPlan]]]:
    """(K, N, M, plans) of a timing run; ``shipped(m, k, n)`` is the plan a call takes."""
    return [(k, n, m, candidates(m, k, n, bits, sms, shipped(m, k, n))) for k, n in shapes for m in ms]


def run_warm(out: Path, bits: int, ms: list[int], shapes: list[tuple[int, int]], shard: tuple[int, int]) -> None:
    """Compile this shard's share of what ``run_time`` will launch (one call each)."""
    dev = torch.device(DEVICE)
    sms = _sms()
    fmt = GPTQ(bits=bits, group_size=128, sym=True)
    kernel = HopperWgmmaGPTQ(fmt, dev)
    prepared: dict[tuple[int, int], Any] = {}

    def weights(k: int, n: int) -> Any:
        if (k, n) not in prepared:
            stored = _weights(fmt, k, n, 1)[0]
            prepared[(k, n)] = kernel.prepare({a: t.to(dev) for a, t in stored.items()})
        return prepared[(k, n)]

    points = _points(bits, ms, shapes, sms, lambda m, k, n: plan_of(m, weights(k, n), dev))
    # Launches that compile the same kernel go to the same shard (what the kernel is
    # specialized on: the plan's constexprs, and M = 1).
    groups: dict[tuple, list] = {}
    for k, n, m, plans in points:
        for plan in plans:
            # A Triton or decode plan's split and K are constexprs of its kernel: one kernel per
            # (plan, shape).
            key = (("other", str(plan), k, n, m == 1) if isinstance(plan, TritonPlan | DecodePlan) else
                   ("wgmma", plan.wg, plan.bm, plan.stages, plan.split > 1, plan.per_wait, plan.in_flight, plan.ws,
                    plan.late_scale, plan.maxnreg, m == 1))
            groups.setdefault(key, []).append((k, n, m, plan))
    mine = [u for key in sorted(groups)[shard[0]::shard[1]] for u in groups[key]]
    t0, done = time.time(), 0
    for k, n, m, plan in mine:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        try:
            linear(x, weights(k, n), plan)
            done += 1
        except Exception as exc:
            print(f"warm: {plan} at K{k} N{n} M{m}: {type(exc).__name__}: {exc}"[:300], flush=True)
    _sync()
    print(f"warm {shard[0]}/{shard[1]}: {done} launches of {len(mine)} ({len(groups)} kernels in all) in "
          f"{time.time() - t0:.0f}s", flush=True)


def _judge_rows(y: torch.Tensor, x: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype,
                gen: torch.Generator) -> Any:
    """``y`` against the float64 golden output on up to 1024 of its rows (the first, the
    last and a random draw): a full comparison of an 8192-row output would cost more than
    the timing."""
    m = x.shape[0]
    rows = torch.arange(m) if m <= 1024 else torch.cat([torch.tensor([0, m - 1]), torch.randperm(m, generator=gen)[:1022]])
    rows = rows.to(x.device)
    ref = linear_reference(x.index_select(0, rows), golden).cpu()
    return judge_output(y.index_select(0, rows), ref, dtype)


def _weights(fmt: GPTQ, k: int, n: int, sets: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return with_fresh_codes(fmt.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen), sets, gen)


def _shown(row: dict | None, cublas_us: float) -> str:
    return f"{row['us']:.1f} ({cublas_us / row['us']:.2f}x)" if row else "-"


def run_time(out: Path, bits: int, ms: list[int], shapes: list[tuple[int, int]], dtypes: list[str],
             peers: tuple[str, ...] = ("cublas", "triton_int4", "aten_cuda")) -> list[dict]:
    dev = torch.device(DEVICE)
    sms = _sms()
    fmt = GPTQ(bits=bits, group_size=128, sym=True)
    gen = torch.Generator().manual_seed(7)
    rows: list[dict] = []
    name = f"time-{bits}-{'-'.join(dtypes)}.json"
    for k, n in shapes:
        sets = max(2, -(-160 * 2**20 // (k * n * bits // 8)))
        stored = _weights(fmt, k, n, sets)
        mine = HopperWgmmaGPTQ(fmt, dev)
        mine_p = [mine.prepare({a: t.to(dev) for a, t in s.items()}) for s in stored]
        old = old_p = tiny = tiny_p = None
        if "triton_int4" in peers:
            from quantcore.backends.triton_int4.kernel import TritonInt4GPTQ

            old = TritonInt4GPTQ(fmt, dev)
            old_p = [old.prepare({a: t.to(dev) for a, t in s.items()}) for s in stored]
        if "aten_cuda" in peers and bits == 4:
            from quantcore.backends.aten_cuda.kernel import AtenCudaGPTQ

            tiny = AtenCudaGPTQ(fmt, dev)
            tiny_p = [tiny.prepare({a: t.to(dev) for a, t in s.items()}, dtype=torch.bfloat16) for s in stored]
        dense_sets = max(2, -(-160 * 2**20 // (k * n * 2)))
        golden = fmt.dequantize(stored[0], torch.float64).to(dev)
        for dname in dtypes:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dname]
            dense = [torch.randn(n, k, device=dev, dtype=dtype) for _ in range(dense_sets)]
            for m in ms:
                xsets = max(2, min(sets, -(-512 * 2**20 // (m * k * 2))))  # x sets beyond L2, within memory
                xs = [torch.randn(m, k, device=dev, dtype=dtype) for _ in range(xsets)]
                names, fns, nsets, plans = [], [], [], []
                names.append("cublas")
                fns.append(lambda i, xs=xs, d=dense: torch.nn.functional.linear(xs[i % len(xs)], d[i % len(d)]))
                nsets.append(len(dense))
                if old is not None:
                    names.append("triton_int4")
                    fns.append(lambda i, xs=xs, kern=old, ps=old_p: kern(xs[i % len(xs)], ps[i % len(ps)]))
                    nsets.append(sets)
                if tiny is not None and m <= 128 and dtype == torch.bfloat16:
                    names.append("aten_cuda")
                    fns.append(lambda i, xs=xs, kern=tiny, ps=tiny_p: kern(xs[i % len(xs)], ps[i % len(ps)]))
                    nsets.append(sets)
                default = plan_of(m, mine_p[0], dev)
                for plan in candidates(m, k, n, bits, sms, default):
                    try:
                        y = linear(xs[0], mine_p[0], plan)
                        c = _judge_rows(y, xs[0], golden, dtype, gen)
                    except Exception as exc:
                        rows.append({"k": k, "n": n, "m": m, "dtype": dname, "bits": bits, "variant": "hopper",
                                     "plan": plan.__dict__, "error": f"{type(exc).__name__}: {exc}"[:300]})
                        continue
                    if not c.ok:
                        rows.append({"k": k, "n": n, "m": m, "dtype": dname, "bits": bits, "variant": "hopper",
                                     "plan": plan.__dict__, "error": f"wrong: {c.problem}"})
                        print(f"WRONG {plan} K{k} N{n} M{m}: {c.problem}", flush=True)
                        continue
                    names.append("hopper")
                    plans.append(plan)
                    fns.append(lambda i, xs=xs, plan=plan, ps=mine_p: linear(xs[i % len(xs)], ps[i % len(ps)], plan))
                    nsets.append(sets)
                t0 = time.time()
                calls = 8 if m >= 2048 else 32  # a replay of 8 large calls already dwarfs the event resolution
                timings = time_interleaved(fns, DEVICE, rounds=3, graph=True, sets=nsets, graph_calls=calls)
                pi = 0
                for vname, t in zip(names, timings, strict=True):
                    row = {"k": k, "n": n, "m": m, "dtype": dname, "bits": bits, "variant": vname,
                           "us": t.median_s * 1e6, "spread": t.spread, "method": t.method}
                    if vname == "hopper":
                        row["plan"] = plans[pi].__dict__
                        row["default"] = plans[pi] == default
                        pi += 1
                    rows.append(row)
                here = rows[-len(names):]
                mine_rows = [r for r in here if r["variant"] == "hopper"]
                cub = next(r["us"] for r in here if r["variant"] == "cublas")
                ship = next((r for r in mine_rows if r["default"]), None)
                kinds = {kind: [r for r in mine_rows if _kind(r["plan"]) == kind]
                         for kind in ("waited", "in flight", WS_KIND, LATE_KIND, "triton")}
                waited = min(kinds["waited"], key=lambda r: r["us"], default=None)
                flying = min(kinds["in flight"], key=lambda r: r["us"], default=None)
                produced = min(kinds[WS_KIND], key=lambda r: r["us"], default=None)
                late = min(kinds[LATE_KIND], key=lambda r: r["us"], default=None)
                small = min(kinds["triton"], key=lambda r: r["us"], default=None)

                print(f"{bits}b {dname} K{k} N{n} M{m}: cublas {cub:.1f} | shipped {_shown(ship, cub)} | best waited "
                      f"{_shown(waited, cub)} | best in flight {_shown(flying, cub)} {flying['plan'] if flying else ''} "
                      f"| best ws {_shown(produced, cub)} {produced['plan'] if produced else ''} "
                      f"| best late {_shown(late, cub)} {late['plan'] if late else ''} "
                      f"| best triton {_shown(small, cub)} {small['plan'] if small else ''} "
                      f"[{time.time() - t0:.0f}s]", flush=True)
                (out / name).write_text(json.dumps(rows, indent=1))
                del xs
        del golden
    return rows


#: A timed plan replaces the one a call took (``default``) only when at least this much faster.
MARGIN = 0.03
#: The kind (``_kind``) of a warp-specialised plan: never shipped unless a check ran it.
WS_KIND = "warp-specialised"
#: The kind of a late-scale plan (with or without the producer), likewise.
LATE_KIND = "late scale"


def _kind(plan: dict) -> str:
    if "path" in plan:
        return "triton"
    if plan.get("kind") == "decode":
        return "decode"
    if plan.get("late_scale"):
        return LATE_KIND
    if plan.get("ws"):
        return WS_KIND
    return "in flight" if plan.get("in_flight") else "two blocks per wait" if plan.get("per_wait") == 2 else "waited"


def unsafe_kinds(check: list[dict]) -> set[str]:
    """Kinds of plan (``_kind``) with a check cell wrong or not bit-identical across runs."""
    return {_kind(r["plan"]) for r in check if isinstance(r["plan"], dict) and not (r["ok"] and r.get("same", True))}


def unchecked_kinds(check: list[dict]) -> set[str]:
    """The warp-specialised kind unless the check ran it: a check from before it existed,
    or none, proves nothing of it."""
    ran = {_kind(r["plan"]) for r in check if isinstance(r["plan"], dict)}
    return {WS_KIND, LATE_KIND} - ran


def best_table(rows: list[dict], info: dict, keep: dict | None = None, unsafe: set[str] = frozenset()) -> dict:
    """The fastest correct plan per (bits, K, N, M) of bf16 timings: ``tuned-<card>.json``;
    where it cannot end gated, also the fastest that can (``"gated"``).
    A plan of a kind in ``unsafe`` is never taken; one that beats the plan the call took
    by less than ``MARGIN`` does not replace it; entries of ``keep`` (an earlier table of
    the card) for keys not timed here stay."""
    timed: dict[tuple[int, int, int, int], list[dict]] = {}
    for r in rows:
        # The plan a call took stays a candidate whatever its kind: a table shipped it
        # after a check of its own; a check of other kinds says nothing against it.
        if (r.get("variant") == "hopper" and r.get("dtype") == "bf16" and "us" in r
                and (r.get("default") or _kind(r["plan"]) not in unsafe)):
            timed.setdefault((r["bits"], r["k"], r["n"], r["m"]), []).append(r)
    plans = {}
    for (b, k, n, m), rs in timed.items():
        best = min(rs, key=lambda r: r["us"])
        shipped = next((r for r in rs if r.get("default")), None)
        if shipped is not None and best["us"] > (1 - MARGIN) * shipped["us"]:
            best = shipped
        plans[(b, k, n, m)] = {"bits": b, "k": k, "n": n, "m": m, "plan": best["plan"], "us": round(best["us"], 2)}
        if gated_plan_refusal(plan_from_dict(best["plan"])):
            # the fastest plan that can end gated, for a fused gate/up layer's gated call (tuned.py)
            gated = [r for r in rs if not gated_plan_refusal(plan_from_dict(r["plan"]))]
            if gated:
                fast = min(gated, key=lambda r: r["us"])
                plans[(b, k, n, m)] |= {"gated": fast["plan"], "gated_us": round(fast["us"], 2)}
    for e in (keep or {}).get("plans", []):
        plans.setdefault((e["bits"], e["k"], e["n"], e["m"]), e)
    return {"device": info["device"], "card": info["card_key"], "source": "tools/probes/hopper_wgmma_sweep.py",
            "plans": [plans[key] for key in sorted(plans)]}


def _shard(text: str) -> tuple[int, int]:
    i, n = (int(v) for v in text.split("/"))
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard wants i/n with 0 <= i < n, got {text}")
    return i, n


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", nargs="+", metavar="JSON",
                    help="with --out DIR: write DIR/tuned-<card>.json from the device.json, time-*.json and "
                         "check.json given")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=("check", "merge", "warm", "time"),
                    help="merge: the shards' check files into check.json")
    ap.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/N", help="check or warm: this share of N")
    ap.add_argument("--repeat", type=int, default=1, help="check: runs of each cell")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--peers", default="cublas,triton_int4,aten_cuda")
    ap.add_argument("--focus", choices=("late", "regs", "splits"), action="append", default=[],
                    help="check and time one kind of plan only (with the plan a call takes)")
    args = ap.parse_args(argv)
    FOCUS[:] = args.focus
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.table:
        info = json.loads(next(Path(p) for p in args.table if p.endswith("device.json")).read_text())
        rows = [r for p in args.table if Path(p).name.startswith("time-") for r in json.loads(Path(p).read_text())]
        check = [r for p in args.table if Path(p).name == "check.json" for r in json.loads(Path(p).read_text())]
        unsafe = unsafe_kinds(check) | unchecked_kinds(check)
        if not check:
            print(f"no check.json given: every kind of plan but {sorted(unchecked_kinds([]))} is taken as checked")
        elif unsafe:
            print(f"not shipped (wrong or unrepeatable in the check): {sorted(unsafe)}")
        slug = CardKey(**info["card_key"]).slug
        path = out / f"tuned-{slug}.json"
        table = best_table(rows, info, json.loads(path.read_text()) if path.exists() else None, unsafe)
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"{len(table['plans'])} plans for {slug}")
        return 0
    if args.only == "merge":
        merge_checks(out)
        return 0
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    if args.only == "warm":
        run_warm(out, args.bits, ms, shapes, args.shard)
        return 0
    info = _device_info()
    (out / "device.json").write_text(json.dumps(info))
    print(info, flush=True)
    if args.only in (None, "check"):
        run_check(out, args.shard, args.repeat)
    if args.only in (None, "time"):
        run_time(out, args.bits, ms, shapes, args.dtypes.split(","), tuple(args.peers.split(",")))
    return 0


def _device_info() -> dict[str, Any]:
    import triton

    key = card_key(0) if DEVICE == "cuda" else CardKey("cpu", 0, 0, 0)
    name = torch.cuda.get_device_properties(0).name if DEVICE == "cuda" else "cpu (a rehearsal)"
    return {"device": name, "card": key.slug, "card_key": key.__dict__, "torch": torch.__version__,
            "triton": triton.__version__}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
