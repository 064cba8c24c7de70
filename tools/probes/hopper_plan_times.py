"""Time named ``hopper_wgmma`` plans at chosen shapes and M beside cuBLAS (an sm_90 GPU, one call).

The sweep (``hopper_wgmma_sweep.py``) times the candidates its own rules make; this times
exactly the plans given, for a question about one kind of plan (a deeper ring, a late
scale, a K split), and checks each plan's output against the call's own plan.

    python -m tools.probes.hopper_plan_times --shapes 4096x14336 --ms 1 \\
        --plans "1,8,8,1,in_flight;1,8,8,1,in_flight,late" [--json PATH]

A plan is ``WG,BM,STAGES,SPLIT`` followed by any of ``in_flight``, ``ws``, ``late``,
``regN`` (a register cap), ``streamN`` (a balanced grid of N programs an SM), or a Triton
plan ``mma,BLOCK_N,BLOCK_M,SPLIT,WARPS,STAGES,BLOCK_B`` (``gemv,…`` likewise); CUDA graphs
over rotating weights, GPTQ 4-bit (``--bits 8``: 8-bit) g128 sym, bf16. Each plan's output is compared with the
table's plan's (relative error) and with its own second run (bit for bit).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import triton

from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.launch import linear
from quantcore.backends.hopper_wgmma.plans import AnyPlan, Plan, TritonPlan
from quantcore.benchmarks.memory import with_fresh_codes
from quantcore.formats.gptq import GPTQ
from quantcore.timing import time_interleaved

from .probe_rows import record_times

SETS = 6


def parse_plan(text: str) -> AnyPlan:
    fields = text.split(",")
    if fields[0] in ("mma", "gemv"):
        block_n, block_m, split, warps, stages, block_b = (int(v) for v in fields[1:7])
        return TritonPlan(fields[0], block_n, block_m, split, warps, stages, block_b)  # type: ignore[arg-type]
    wg, bm, stages, split = (int(v) for v in fields[:4])
    flags = set(fields[4:])
    reg = next((int(f[3:]) for f in flags if f.startswith("reg")), 0)
    stream = next((int(f[6:]) for f in flags if f.startswith("stream")), 0)
    return Plan(wg, bm, stages, split, in_flight="in_flight" in flags, ws="ws" in flags,
                late_scale="late" in flags, maxnreg=reg, stream=stream)


def weight_sets(kernel: HopperWgmmaGPTQ, k: int, n: int, gen: torch.Generator,
                dtype: torch.dtype) -> tuple[list[dict[str, torch.Tensor]], list[Any], list[torch.Tensor]]:
    """``SETS`` stored weights of K×N (fresh codes, same scales), each prepared on the
    GPU, and three dense ``dtype`` weights for cuBLAS: together more than the L2 holds."""
    fmt = kernel.fmt
    stored = with_fresh_codes(fmt.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen), SETS, gen)
    prepared = [kernel.prepare({a: t.to(kernel.device) for a, t in one.items()}) for one in stored]
    dense = [torch.randn(n, k, generator=gen).to(kernel.device, dtype) * 0.02 for _ in range(3)]
    return stored, prepared, dense


def run(shapes: list[tuple[int, int]], ms: list[int], plans: list[str], bits: int = 4) -> dict[str, Any]:
    dev = torch.device("cuda")
    fmt = GPTQ(bits=bits, group_size=128, sym=True)
    kernel = HopperWgmmaGPTQ(fmt, dev)
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    for k, n in shapes:
        _, prepared, dense = weight_sets(kernel, k, n, gen, torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, generator=gen).to(dev, torch.bfloat16)
            ref = kernel(x, prepared[0]).float()
            names = ["table's plan", "cuBLAS bf16"]
            calls: list[Any] = [lambda i, x=x, p=prepared: kernel(x, p[i % SETS]),
                                lambda i, x=x, d=dense: torch.nn.functional.linear(x, d[i % 3])]
            sets = [SETS, 3]
            for text in plans:
                plan = parse_plan(text)
                try:
                    got = linear(x, prepared[0], plan).float()
                except Exception as exc:  # a plan this shape cannot take: say so, time the rest
                    rows.append({"k": k, "n": n, "m": m, "variant": text, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                err = ((got - ref).norm() / ref.norm()).item()
                again = linear(x, prepared[0], plan).float()
                rows.append({"k": k, "n": n, "m": m, "variant": text, "rel_err_vs_table": err,
                             "repeat_identical": bool(torch.equal(got, again))})
                names.append(text)
                calls.append(lambda i, x=x, p=prepared, plan=plan: linear(x, p[i % SETS], plan))
                sets.append(SETS)
            times = time_interleaved(calls, "cuda", rounds=5, graph=True, sets=sets)
            record_times(rows, names, times, {"k": k, "n": n, "m": m})
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "bits": bits, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x14336")
    p.add_argument("--ms", default="1")
    p.add_argument("--plans", required=True, help="';'-separated plans, e.g. '1,8,8,1,in_flight,late'")
    p.add_argument("--bits", type=int, default=4, choices=(4, 8))
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    shapes = [(int(s.split("x")[0]), int(s.split("x")[1])) for s in a.shapes.split(",")]
    res = run(shapes, [int(m) for m in a.ms.split(",")], [t for t in a.plans.split(";") if t], a.bits)
    for r in res["rows"]:
        extra = r.get("error") or f"{r.get('us', float('nan')):8.2f} us  {r.get('x_cublas', 0):5.2f}x  " \
                                  f"err {r.get('rel_err_vs_table', 0):.1e}  same twice {r.get('repeat_identical', '-')}"
        print(f"{r['k']:6d}x{r['n']:<6d} M{r['m']:<5d} {r['variant']:34s} {extra}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
