"""Which ``triton_int4`` path, tile, split and operand order is fastest per shape (run on a CUDA GPU):

1. ``check``: every path (GEMV, MMA with each operand form, split-K, dequant + cuBLAS)
   on 4/8-bit, sym/asym, groups 32/64/128/−1, act-order, v1, AWQ, bf16/fp16, bias, and
   N/K that are not multiples of a tile, against the float64 golden output.
2. ``time``: per (K, N) × M × bits, the candidate plans (tile, split, operand form) and
   the peers (cuBLAS bf16, ``aten_cuda``) as CUDA-graph replays over rotating weights;
   every timed plan's output is checked too. The kernels compile first, in parallel
   processes that fill Triton's cache.

    python -m tools.probes.triton_int4_tiles --out DIR [--only check|time] [--quick]

Writes ``DIR/sweep.json`` (everything) and prints a compact table last.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import itertools
import json
import math
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import torch

from quantcore.backends.triton_int4.configs import GemvConfig, MmaConfig, Plan
from quantcore.backends.triton_int4.layout import GPTQToTritonInt, TritonIntWeights
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.kernels.gptq_pairs.layout import block_k

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096)]
MS = [1, 4, 16, 32, 64, 128, 512, 2048]
SMS = 132


# --- plans ---------------------------------------------------------------------------------


def _splits(m: int, n: int, blocks: int, bn: int, bm: int, block_b: int) -> list[int]:
    tiles = -(-n // bn) * -(-m // bm)
    auto = max(1, min(blocks // block_b, -(-2 * SMS // tiles)))
    return sorted({auto, min(blocks // block_b, 2 * auto)})


def candidates(m: int, k: int, n: int, bits: int, quick: bool = False) -> list[Plan]:
    blocks = k // block_k(bits)
    plans: list[Plan] = []

    def mma(bn: int, bm: int, warps: int, stages: int, operand: int = 1, bb: int = 1, splits: bool = True) -> None:
        for split in _splits(m, n, blocks, bn, bm, bb) if splits else [1]:
            plans.append(Plan("mma", mma=MmaConfig(bn, bm, split, warps, stages, operand, bb)))

    if m == 1:
        for bn, bb in ((16, 8), (32, 4)):
            tiles = -(-n // bn)
            split = max(1, min(blocks // bb, -(-2 * SMS // tiles)))
            plans.append(Plan("gemv", gemv=GemvConfig(bn, bb, split, 4, 2)))
    if m <= 16:
        for bn, bb, stages in ((128, 1, 3), (128, 2, 3), (64, 1, 4), (64, 2, 3), (256, 1, 3)):
            mma(bn, 16, 4 if bn <= 128 else 8, stages, 1, bb)
    elif m <= 64:
        for bn, bm, bb in ((128, m, 1), (128, m, 2), (64, m, 1), (64, m, 2)):
            mma(bn, bm, 4, 3, 1, bb)
        if m == 64:
            mma(128, 32, 4, 3, 1, 1)
    elif m <= 128:
        for bn, bm, warps, bb in ((128, 64, 4, 1), (128, 128, 8, 1), (64, 128, 4, 1), (128, 128, 8, 2)):
            mma(bn, bm, warps, 3, 1, bb)
    else:
        for bn, bm, warps, stages, operand in ((128, 128, 8, 3, 1), (128, 128, 8, 4, 1), (128, 128, 8, 3, 2),
                                               (128, 256, 8, 3, 2), (256, 128, 8, 3, 2), (128, 128, 4, 4, 2)):
            mma(bn, bm, warps, stages, operand, 1, splits=False)
        plans.append(Plan("dequant"))
    if quick:
        plans = plans[::3]
    return list(dict.fromkeys(plans))


# --- weights -------------------------------------------------------------------------------


def random_weights(k: int, n: int, bits: int, sets: int, device: str, seed: int = 0) -> list[TritonIntWeights]:
    """Golden-quantized weights (first set) and sets of fresh random codes with the same
    scales: distinct memory, same work."""
    fmt = GPTQ(bits=bits, group_size=128, sym=True)
    gen = torch.Generator().manual_seed(seed)
    dense = (torch.randn(n, k, generator=gen) * 0.02).to(device)
    base = GPTQToTritonInt(fmt).apply(fmt.quantize(dense))
    out = [base]
    for i in range(sets - 1):
        codes = torch.randint(-(2**31), 2**31 - 1, base.qweight.shape, generator=gen.manual_seed(seed + i + 1),
                              dtype=torch.int32)
        out.append(dataclasses.replace(base, qweight=codes.to(device), runtime={}))
    return out


def dense_of(w: TritonIntWeights) -> torch.Tensor:
    """Ŵ [N, K] in float32 from the prepared layout (the inverse transform + golden)."""
    fmt = GPTQ(bits=w.bits, group_size=128, sym=True)
    return fmt.dequantize(GPTQToTritonInt(fmt).invert(w), dtype=torch.float32)


# --- check ---------------------------------------------------------------------------------


CHECK_FORMATS: list[Any] = [
    GPTQ(bits=4, group_size=128), GPTQ(bits=4, group_size=128, sym=False, desc_act=True),
    GPTQ(bits=4, group_size=32, sym=False), GPTQ(bits=4, group_size=64, checkpoint_format="v1", sym=False),
    GPTQ(bits=4, group_size=-1, sym=False), GPTQ(bits=8, group_size=128), GPTQ(bits=8, group_size=32, sym=False),
    GPTQ(bits=8, group_size=-1, desc_act=True, sym=False), AWQ(group_size=128), AWQ(group_size=64, zero_point=False),
]
CHECK_PLANS = [None, Plan("gemv", gemv=GemvConfig(16, 8, 3)), Plan("mma", mma=MmaConfig(128, 16, 3, 4, 3, 1, 2)),
               Plan("mma", mma=MmaConfig(64, 64, 2, 4, 3, 1)), Plan("mma", mma=MmaConfig(128, 128, 1, 8, 3, 2)),
               Plan("mma", mma=MmaConfig(128, 64, 1, 4, 3, 2, 2)), Plan("dequant")]


def check_shape(fmt: Any) -> tuple[int, int]:
    """K not a multiple of the block (128 at 4 bits, 64 at 8) where the group size allows;
    N = 392: no multiple of any tile."""
    gs = fmt.group_size
    if gs == 128:
        return 1408, 392
    return (1376 if fmt.bits == 8 and gs == 32 else 1344), 392


def check_format(index: int, device: str = "cuda", ms: tuple[int, ...] = (1, 5, 33, 200),
                 plans: list[Plan | None] | None = None) -> list[dict[str, Any]]:
    """Every plan of CHECK_PLANS on one format of CHECK_FORMATS, bf16 and fp16."""
    from quantcore.backends.triton_int4.kernel import TritonInt4AWQ, TritonInt4GPTQ
    from quantcore.backends.triton_int4.launch import linear
    from quantcore.ops.linear import linear_reference
    from quantcore.ops.tolerance import compare, tolerance_for

    fmt = CHECK_FORMATS[index]
    gen = torch.Generator().manual_seed(index)
    k, n = check_shape(fmt)
    dense = torch.randn(n, k, generator=gen) * 0.05
    tensors = fmt.quantize(dense)
    tensors["bias"] = torch.randn(n, generator=gen).half()
    golden_w = fmt.dequantize(tensors)
    cls = TritonInt4AWQ if isinstance(fmt, AWQ) else TritonInt4GPTQ
    kernel = cls(fmt, device)
    prepared = kernel.prepare({a: t.to(device) for a, t in tensors.items()})
    rows = []
    for m, dtype, plan in itertools.product(ms, (torch.bfloat16, torch.float16), CHECK_PLANS if plans is None else plans):
        x = torch.randn(m, k, generator=gen).to(dtype)
        ref = linear_reference(x, golden_w, tensors["bias"])
        xd = x.to(device)
        row = {"format": fmt.slug, "m": m, "dtype": str(dtype).removeprefix("torch."), "plan": _plan_str(plan)}
        try:
            for _ in range(2):  # twice: the split-K counters must be left at zero
                if plan is None:
                    y = kernel(xd, prepared)
                else:
                    x2 = xd.index_select(1, prepared.ret_idx) if prepared.ret_idx is not None else xd
                    y = linear(x2.contiguous(), prepared, plan)
            if device == "cuda":
                torch.cuda.synchronize()
            c = compare(y, ref, tolerance_for(dtype))
            rows.append({**row, "ok": c.ok, "rel": c.rel_err, "max": c.max_err, "why": c.problem})
        except Exception as exc:  # report, keep going
            rows.append({**row, "ok": False, "why": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return rows


def check(quick: bool, workers: int) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    indices = list(range(len(CHECK_FORMATS)))[:: 3 if quick else 1]
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=min(workers, len(indices)), mp_context=ctx) as pool:
        rows = [r for part in pool.map(check_format, indices) for r in part]
    bad = [r for r in rows if not r["ok"]]
    print(f"check: {len(rows) - len(bad)}/{len(rows)} ok in {time.perf_counter() - t0:.0f}s", flush=True)
    for r in bad[:40]:
        print("  FAIL", r, flush=True)
    return rows


def _plan_str(plan: Plan | None) -> str:
    if plan is None:
        return "auto"
    cfg = plan.gemv or plan.mma
    return plan.path + ("" if cfg is None else ":" + ",".join(f"{v}" for v in dataclasses.astuple(cfg)))


# --- time ----------------------------------------------------------------------------------


def _jobs(quick: bool) -> list[tuple[int, int, int, int]]:
    """(k, n, m, bits) to time."""
    jobs = [(k, n, m, 4) for (k, n), m in itertools.product(SHAPES, MS)]
    jobs += [(k, n, m, 8) for (k, n), m in itertools.product(SHAPES, (1, 16, 128))]
    return jobs[::4] if quick else jobs


def _compile_job(args: tuple[int, int, int, int, bool]) -> str:
    """In a child process: run every candidate once (fills Triton's cache)."""
    k, n, m, bits, quick = args
    from quantcore.backends.triton_int4.launch import linear

    w = random_weights(k, n, bits, 1, "cuda")[0]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for plan in candidates(m, k, n, bits, quick):
        linear(x, w, plan)
    torch.cuda.synchronize()
    return f"{k}x{n} M{m} {bits}b"


def precompile(quick: bool, workers: int) -> None:
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        for _ in pool.map(_compile_job, [(*j, quick) for j in _jobs(quick)]):
            pass
    print(f"precompiled in {time.perf_counter() - t0:.0f}s", flush=True)


def time_all(device: str, quick: bool, log: Path | None = None) -> list[dict[str, Any]]:
    from quantcore.backends.triton_int4.launch import linear
    from quantcore.benchmarks.memory import rotation_sets
    from quantcore.formats.gptq import GPTQ as _G
    from quantcore.timing import time_interleaved

    rows = []
    aten = None
    try:
        from quantcore.backends.aten_cuda.kernel import AtenCudaGPTQ

        aten = AtenCudaGPTQ(_G(bits=4, group_size=128), device)
    except Exception as exc:  # pragma: no cover - reported
        print("aten_cuda unavailable:", exc)
    by_weight: dict[tuple[int, int, int], Any] = {}
    for k, n, m, bits in _jobs(quick):
        key = (k, n, bits)
        if key not in by_weight:
            by_weight.clear()
            torch.cuda.empty_cache()
            sets = rotation_sets(k * n * bits // 8, device)
            ws = random_weights(k, n, bits, sets, device)
            dense = [torch.randn(n, k, device=device, dtype=torch.bfloat16)
                     for _ in range(rotation_sets(2 * k * n, device))]
            w_ref = dense_of(ws[0])
            aten_ws = None
            if aten is not None and bits == 4 and device.startswith("cuda"):
                fmt = _G(bits=4, group_size=128, sym=True)
                stored = GPTQToTritonInt(fmt).invert(ws[0])
                aten_ws = [aten.prepare(stored, dtype=torch.bfloat16)] * 1
            by_weight[key] = (ws, dense, w_ref, aten_ws)
        ws, dense, w_ref, aten_ws = by_weight[key]
        xs = [torch.randn(m, k, device=device, dtype=torch.bfloat16) for _ in range(max(2, len(ws)))]
        ref = (xs[0].float() @ w_ref.T)
        plans = candidates(m, k, n, bits, quick)
        names, fns, sets, errs = [], [], [], []
        for plan in plans:
            y = linear(xs[0], ws[0], plan)
            errs.append(((y.float() - ref).norm() / ref.norm()).item())
            names.append(_plan_str(plan))
            fns.append(lambda i, plan=plan, xs=xs, ws=ws: linear(xs[i % len(xs)], ws[i % len(ws)], plan))
            sets.append(len(ws))
        names.append("cublas_bf16")
        fns.append(lambda i, xs=xs, dense=dense: torch.nn.functional.linear(xs[i % len(xs)], dense[i % len(dense)]))
        sets.append(len(dense))
        errs.append(0.0)
        if aten_ws is not None:
            names.append("aten_cuda")
            fns.append(lambda i, xs=xs, prepared=aten_ws[0]: aten(xs[i % len(xs)], prepared))
            sets.append(1)
            errs.append(((aten(xs[0], aten_ws[0]).float() - ref).norm() / ref.norm()).item())
        timings = time_interleaved(fns, device, rounds=5 if m < 512 else 3, graph=True, sets=sets)
        for name, t, err in zip(names, timings, errs, strict=True):
            rows.append({"k": k, "n": n, "m": m, "bits": bits, "variant": name, "us": t.median_s * 1e6,
                         "spread": t.spread, "rel_err": err, "note": t.note})
        mine = rows[-len(names):]
        if log is not None:  # partial results survive a timeout
            with log.open("a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in mine)
        ok = [r for r in mine if r["variant"] not in ("cublas_bf16", "aten_cuda") and r["rel_err"] < 1e-2]
        cub = next(r for r in mine if r["variant"] == "cublas_bf16")
        if not ok:
            print(f"{k}x{n} M{m:<5} {bits}b NO CORRECT VARIANT: {[(r['variant'], r['rel_err']) for r in mine]}")
            continue
        best = min(ok, key=lambda r: r["us"])
        print(f"{k}x{n} M{m:<5} {bits}b best {best['us']:8.1f}us ({cub['us'] / best['us']:.2f}x cuBLAS "
              f"{cub['us']:.1f}) {best['variant']}", flush=True)
    return rows


def summary(rows: list[dict[str, Any]], copy_bw: float) -> str:
    lines = ["K×N        bits     M   cuBLAS   aten   best   ×cuBLAS  copyBW  plan"]
    keys = dict.fromkeys((r["k"], r["n"], r["bits"], r["m"]) for r in rows)
    for k, n, bits, m in keys:
        mine = [r for r in rows if (r["k"], r["n"], r["bits"], r["m"]) == (k, n, bits, m)]
        cub = next(r["us"] for r in mine if r["variant"] == "cublas_bf16")
        aten = next((r["us"] for r in mine if r["variant"] == "aten_cuda"), math.nan)
        ok = [r for r in mine if r["variant"] not in ("cublas_bf16", "aten_cuda") and r["rel_err"] < 1e-2]
        if not ok:
            lines.append(f"{k}x{n:<6} {bits:>3} {m:>5} {cub:8.1f} {aten:6.1f}  no correct variant")
            continue
        best = min(ok, key=lambda r: r["us"])
        nbytes = k * n * bits / 8 + (k // 128) * n * 2 + 2 * m * (k + n)
        share = nbytes / (best["us"] * 1e-6) / copy_bw
        lines.append(f"{k}x{n:<6} {bits:>3} {m:>5} {cub:8.1f} {aten:6.1f} {best['us']:6.1f} {cub / best['us']:7.2f} "
                     f"{100 * share:6.0f}%  {best['variant']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--only", choices=("check", "time"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workers", type=int, default=14)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda"
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.only in (None, "check"):
        result["check"] = check(args.quick, args.workers)
        (out / "sweep.json").write_text(json.dumps(result, indent=1))
    if args.only in (None, "time"):
        from quantcore.benchmarks.ceilings import measure

        precompile(args.quick, args.workers)
        copy_bw = measure(device).copy_bytes_per_s
        result["copy_bytes_per_s"] = copy_bw
        result["time"] = time_all(device, args.quick, out / "time_partial.jsonl")
        (out / "sweep.json").write_text(json.dumps(result, indent=1))
        print(summary(result["time"], copy_bw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
