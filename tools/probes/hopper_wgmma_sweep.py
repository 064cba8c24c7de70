"""One device call's worth of work for ``hopper_wgmma`` (an sm_90 GPU):

1. ``check``: every plan shape (1–2 warpgroups, 8–256 activation rows, split K or not)
   on 4/8-bit, sym/asym, groups 32/64/128/−1, act-order, v1, AWQ, bf16/fp16, bias,
   fp32/bf16 scales, and K and N that are not multiples of a block or tile, against the
   float64 golden output (``quantcore.ops``' tolerance).
2. ``time``: per (K, N) × M, candidate plans of ``hopper_wgmma`` and the peers (cuBLAS
   bf16, ``triton_int4``'s default, ``aten_cuda`` at small M) as CUDA-graph replays over
   rotating weights, interleaved; every timed plan's output is checked first.

    python -m tools.probes.hopper_wgmma_sweep --out DIR [--only check|time] [--bits 4]

Writes ``DIR/check.json`` and ``DIR/time-<bits>-<dtypes>.json`` as it goes (a call cut
short keeps what was done) and prints a compact table last. On any machine,
``--table DIR/device.json DIR/time-*.json --out FOLDER`` writes the fastest plans as the
backend's ``tuned-<card>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaAWQ, HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.launch import linear, plan_of
from quantcore.backends.hopper_wgmma.plans import Plan
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.ops.linear import linear_reference
from quantcore.ops.tolerance import judge_output
from quantcore.probe.card import CardKey, card_key
from quantcore.timing import time_interleaved

SHAPES = [(4096, 14336), (14336, 4096), (4096, 4096), (4096, 1024)]
MS = [1, 16, 32, 64, 128, 512, 2048, 8192]

CHECK_PLANS = [Plan(1, 8, 3, 1), Plan(1, 16, 4, 3, 2), Plan(1, 32, 2, 2), Plan(1, 64, 4, 1, 2),
               Plan(1, 128, 4, 2), Plan(2, 128, 4, 1, 2), Plan(2, 256, 3, 2)]


def _run(kernel: Any, prepared: Any, x: torch.Tensor, plan: Plan | None) -> torch.Tensor:
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
    ]
    return cases


def run_check(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    dev = torch.device("cuda")
    for ci, case in enumerate(check_cases()):
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
        for dname in case["dtypes"]:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dname]
            for m in (1, 37, 300):
                x = torch.randn(m, k, generator=gen).to(dtype)
                ref = linear_reference(x, dense, stored.get("bias"))
                for plan in case["plans"]:
                    row = {"fmt": fmt.slug, "k": k, "n": n, "m": m, "dtype": dname,
                           "scales": str(stored["scales"].dtype), "bias": bool(case.get("bias")),
                           "plan": plan.__dict__ if plan else "default"}
                    try:
                        y = _run(kernel, prepared, x.to(dev), plan)
                        torch.cuda.synchronize()
                        c = judge_output(y, ref, dtype)
                        row |= {"ok": c.ok, "rel": c.rel_err, "max": c.max_err, "why": c.problem}
                    except Exception as exc:
                        row |= {"ok": False, "why": f"{type(exc).__name__}: {exc}"[:400],
                                "trace": traceback.format_exc()[-1500:]}
                    rows.append(row)
                    if not row["ok"]:
                        print("FAIL", json.dumps({a: b for a, b in row.items() if a != "trace"}), flush=True)
        (out / "check.json").write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if not r["ok"]]
    print(f"check: {len(rows) - len(bad)}/{len(rows)} within tolerance", flush=True)
    return rows


# --- timing --------------------------------------------------------------------------------


def candidates(m: int, k: int, n: int, bits: int, sms: int) -> list[Plan]:
    blocks = k // (512 // bits)
    tiles_n = n // 64
    out: list[Plan] = []

    def add(wg: int, bm: int, stages: int, per_sm: list[float], per_wait: tuple[int, ...] = (1, 2)) -> None:
        tiles = -(-tiles_n // wg) * -(-m // bm)
        for p in per_sm:
            split = max(1, min(blocks // 2, round(p * sms / tiles)))
            for pw in per_wait:
                plan = Plan(wg, bm, stages, split, pw)
                if plan not in out:
                    out.append(plan)

    if m <= 64:
        bm = max(16, 1 << (m - 1).bit_length())
        add(1, bm, 4, [2, 4], (1,))
        add(1, bm, 8 if bm <= 32 else 5, [1, 2, 4])
        if m == 1:
            add(1, 8, 8, [2, 4])
        if m == 64:
            add(2, 64, 4, [1, 2])
    elif m <= 128:
        add(1, 128, 3, [1, 2])
        add(2, 128, 4, [1, 2])
        add(1, 64, 6, [2, 4])
    else:
        add(2, 128, 4, [1, 2])
        add(1, 128, 3, [1])
        if bits == 4:
            add(2, 256, 3, [1, 2])
    return out


def _weights(fmt: GPTQ, k: int, n: int, sets: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    base = fmt.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen)
    out = [base]
    for _ in range(sets - 1):
        t = dict(base)
        t["qweight"] = torch.randint(-(2**31), 2**31 - 1, base["qweight"].shape, generator=gen, dtype=torch.int32)
        out.append(t)
    return out


def run_time(out: Path, bits: int, ms: list[int], shapes: list[tuple[int, int]], dtypes: list[str]) -> list[dict]:
    from quantcore.backends.aten_cuda.kernel import AtenCudaGPTQ
    from quantcore.backends.triton_int4.kernel import TritonInt4GPTQ

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    fmt = GPTQ(bits=bits, group_size=128, sym=True)
    rows: list[dict] = []
    for k, n in shapes:
        sets = max(2, -(-160 * 2**20 // (k * n * bits // 8)))
        stored = _weights(fmt, k, n, sets)
        mine = HopperWgmmaGPTQ(fmt, dev)
        mine_p = [mine.prepare({a: t.to(dev) for a, t in s.items()}) for s in stored]
        old = TritonInt4GPTQ(fmt, dev)
        old_p = [old.prepare({a: t.to(dev) for a, t in s.items()}) for s in stored]
        tiny = None
        if bits == 4:
            tiny = AtenCudaGPTQ(fmt, dev)
            tiny_p = [tiny.prepare({a: t.to(dev) for a, t in s.items()}, dtype=torch.bfloat16) for s in stored]
        dense_sets = max(2, -(-160 * 2**20 // (k * n * 2)))
        for dname in dtypes:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dname]
            dense = [torch.randn(n, k, device=dev, dtype=dtype) for _ in range(dense_sets)]
            golden = fmt.dequantize(stored[0], torch.float64)
            for m in ms:
                xsets = max(2, sets)
                xs = [torch.randn(m, k, device=dev, dtype=dtype) for _ in range(xsets)]
                ref = linear_reference(xs[0].cpu(), golden)
                names, fns, nsets, plans = [], [], [], []
                names.append("cublas")
                fns.append(lambda i, xs=xs, d=dense: torch.nn.functional.linear(xs[i % len(xs)], d[i % len(d)]))
                nsets.append(len(dense))
                names.append("triton_int4")
                fns.append(lambda i, xs=xs, kern=old, ps=old_p: kern(xs[i % len(xs)], ps[i % len(ps)]))
                nsets.append(sets)
                if tiny is not None and m <= 128 and dtype == torch.bfloat16:
                    names.append("aten_cuda")
                    fns.append(lambda i, xs=xs, kern=tiny, ps=tiny_p: kern(xs[i % len(xs)], ps[i % len(ps)]))
                    nsets.append(sets)
                default = plan_of(m, mine_p[0], dev)
                cands = candidates(m, k, n, bits, sms)
                if default not in cands:
                    cands.insert(0, default)
                for plan in cands:
                    try:
                        y = linear(xs[0], mine_p[0], plan)
                        c = judge_output(y, ref, dtype)
                    except Exception as exc:
                        rows.append({"k": k, "n": n, "m": m, "dtype": dname, "bits": bits, "variant": "hopper",
                                     "plan": plan.__dict__, "error": f"{type(exc).__name__}: {exc}"[:300]})
                        continue
                    if not c.ok:
                        rows.append({"k": k, "n": n, "m": m, "dtype": dname, "bits": bits, "variant": "hopper",
                                     "plan": plan.__dict__, "error": f"wrong: {c.problem}"})
                        continue
                    names.append("hopper")
                    plans.append(plan)
                    fns.append(lambda i, xs=xs, plan=plan, ps=mine_p: linear(xs[i % len(xs)], ps[i % len(ps)], plan))
                    nsets.append(sets)
                t0 = time.time()
                timings = time_interleaved(fns, "cuda", rounds=3, graph=True, sets=nsets)
                pi = 0
                for name, t in zip(names, timings, strict=True):
                    row = {"k": k, "n": n, "m": m, "dtype": dname, "bits": bits, "variant": name,
                           "us": t.median_s * 1e6, "spread": t.spread, "method": t.method}
                    if name == "hopper":
                        row["plan"] = plans[pi].__dict__
                        row["default"] = plans[pi] == default
                        pi += 1
                    rows.append(row)
                (out / f"time-{bits}-{'-'.join(dtypes)}.json").write_text(json.dumps(rows, indent=1))
                best = min((r for r in rows[-len(names):] if r["variant"] == "hopper"), key=lambda r: r["us"],
                           default=None)
                cub = next(r["us"] for r in rows[-len(names):] if r["variant"] == "cublas")
                old_us = next(r["us"] for r in rows[-len(names):] if r["variant"] == "triton_int4")
                if best:
                    print(f"{bits}b {dname} K{k} N{n} M{m}: cublas {cub:.1f} old {old_us:.1f} ({cub / old_us:.2f}x) "
                          f"new {best['us']:.1f} ({cub / best['us']:.2f}x) {best['plan']} [{time.time() - t0:.0f}s]",
                          flush=True)
                (out / f"time-{bits}-{'-'.join(dtypes)}.json").write_text(json.dumps(rows, indent=1))
                del xs
    return rows


def best_table(rows: list[dict], info: dict) -> dict:
    """The fastest correct plan per (bits, K, N, M) of bf16 timings: ``tuned-<card>.json``."""
    best: dict[tuple[int, int, int, int], dict] = {}
    for r in rows:
        if r.get("variant") != "hopper" or r.get("dtype") != "bf16" or "us" not in r:
            continue
        key = (r["bits"], r["k"], r["n"], r["m"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    plans = [{"bits": b, "k": k, "n": n, "m": m, "plan": r["plan"], "us": round(r["us"], 2)}
             for (b, k, n, m), r in sorted(best.items())]
    return {"device": info["device"], "card": info["card_key"], "source": "tools/probes/hopper_wgmma_sweep.py",
            "plans": plans}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", nargs="+", metavar="JSON",
                    help="with --out DIR: write DIR/tuned-<card>.json from the device.json and time-*.json given")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=("check", "time"))
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    ap.add_argument("--dtypes", default="bf16")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.table:
        info = json.loads(next(Path(p) for p in args.table if p.endswith("device.json")).read_text())
        rows = [r for p in args.table if not p.endswith("device.json") for r in json.loads(Path(p).read_text())]
        table = best_table(rows, info)
        slug = CardKey(**info["card_key"]).slug
        (out / f"tuned-{slug}.json").write_text(json.dumps(table, indent=1) + "\n")
        print(f"{len(table['plans'])} plans for {slug}")
        return 0
    props = torch.cuda.get_device_properties(0)
    key = card_key(0)
    info = {"device": props.name, "card": key.slug, "card_key": key.__dict__, "torch": torch.__version__}
    (out / "device.json").write_text(json.dumps(info))
    print(info, flush=True)
    if args.only in (None, "check"):
        run_check(out)
    if args.only in (None, "time"):
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        run_time(out, args.bits, [int(v) for v in args.ms.split(",")], shapes, args.dtypes.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
