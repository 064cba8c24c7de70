"""The ``turboquant_cutile`` kernel's paths and tiles against ``turboquant_triton`` and cuBLAS
bf16, per M (a developer's probe, CUDA with cuTile installed: docs/cutile.md): what
``backends/turboquant_cutile/plan.py`` ships comes from here.

For each (K, N, M, passes): the cuTile kernel as shipped, its GEMV with other row counts
(M = 1), its matrix-unit kernel with other tiles, its dequantize + cuBLAS path, the Triton
kernel as shipped and cuBLAS bf16 — each checked against the float64 golden output, then
timed as CUDA-graph replays over weight sets that together exceed L2, in the same rounds.
Rows go to ``--json``; a table is printed last.

    python -m tools.probes.turboquant_cutile_paths [--ms 1,16,128,512,2048] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from tabulate import tabulate

from quantcore.backends.turboquant_cutile import TurboQuantCuTile, plan
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.benchmarks.ceilings import ceilings
from quantcore.benchmarks.memory import rotation_sets
from quantcore.benchmarks.suites.turboquant_linear import format_bytes
from quantcore.formats.turboquant import TurboQuant
from quantcore.timing import time_interleaved
from tools.probes.turboquant_paths import _rel_error, _weights, run_cases

DTYPE = torch.bfloat16
SHAPES = ((4096, 14336), (14336, 4096), (4096, 4096))
#: (rows, occupancy hint) tried at M = 1.
GEMV_VARIANTS = [(16, None), (8, None), (8, 4), (8, 8), (16, 4), (4, 8)]
#: (TN, TM, TK) tried below the dense crossover.
GEMM_TILES = {16: [(64, 16, 32), (128, 16, 32), (32, 16, 32), (64, 16, 16)],
              128: [(64, 64, 32), (128, 64, 32), (64, 64, 64), (32, 64, 32)]}
GEMM_OCCUPANCY = (None, 2, 4)


@contextmanager
def _settings(**values: Any) -> Iterator[None]:
    """The plan's constants set for one call (a graph captures the launch it makes)."""
    old = {name: getattr(plan, name) for name in values}
    for name, value in values.items():
        setattr(plan, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(plan, name, value)


def probe(k: int, n: int, m: int, residual: bool, rounds: int, device: str = "cuda") -> list[dict[str, Any]]:
    fmt = TurboQuant(bits=4, group_size=128, residual=residual)
    nbytes = format_bytes(fmt, m, k, n)
    sets = rotation_sets(nbytes, device)
    weights = _weights(fmt, k, n, sets, device)
    cutile, triton_kernel = TurboQuantCuTile(fmt, device), TurboQuantTriton(fmt, device)
    ct_prepared = [cutile.prepare(w, dtype=DTYPE) for w in weights]
    tr_prepared = [triton_kernel.prepare(w, dtype=DTYPE) for w in weights]
    xs = [torch.randn(m, k, device=device, dtype=DTYPE) for _ in range(sets)]
    ref = xs[0].double() @ fmt.dequantize(weights[0]).T  # float64 golden, set 0
    dense = [torch.randn(n, k, device=device, dtype=DTYPE) for _ in range(rotation_sets(2 * k * n, device))]

    def cutile_call(**values: Any) -> Callable[[int], torch.Tensor]:
        def run(i: int) -> torch.Tensor:
            with _settings(**values):
                return cutile(xs[i % sets], ct_prepared[i % sets])
        return run

    variants: dict[str, tuple[Callable[[int], Any], int, int]] = {
        "cutile (shipped)": (cutile_call(), sets, nbytes),
        "triton (shipped)": (lambda i: triton_kernel(xs[i % sets], tr_prepared[i % sets]), sets, nbytes),
    }
    if m == 1:
        for rows, occupancy in GEMV_VARIANTS:
            name = f"cutile gemv {rows} rows" + (f" occupancy {occupancy}" if occupancy else "")
            variants[name] = (cutile_call(GEMV_ROWS=rows, GEMV_OCCUPANCY=occupancy), sets, nbytes)
    else:
        for tn, tm, tk in GEMM_TILES[16 if m <= 16 else 128]:
            tile = (tn, tm, tk)
            variants[f"cutile gemm {tn}x{tm} step {tk}"] = (
                cutile_call(gemm_tiles=lambda m_, half, tile=tile: tile, DEQUANT_FROM_M=1 << 30), sets, nbytes)
        for occupancy in GEMM_OCCUPANCY:
            variants[f"cutile gemm shipped tile occupancy {occupancy}"] = (
                cutile_call(GEMM_OCCUPANCY=occupancy, DEQUANT_FROM_M=1 << 30), sets, nbytes)
        variants["cutile dequant+cuBLAS"] = (cutile_call(DEQUANT_FROM_M=1), sets, nbytes)
    variants["cuBLAS bf16"] = (lambda i: torch.nn.functional.linear(xs[i % len(xs)], dense[i % len(dense)]),
                               len(dense), 2 * (k * n + m * k + m * n))

    rows, keep = [], {}
    for name, (fn, nsets, b) in variants.items():
        row = {"K": k, "N": n, "M": m, "passes": 1 + residual, "variant": name}
        try:
            y = fn(0)
            torch.cuda.synchronize()
            err = _rel_error(y, ref) if name != "cuBLAS bf16" else 0.0
        except Exception as exc:  # a variant that fails is a row, not the end of the probe
            rows.append({**row, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            print(f"  K{k} N{n} M{m} {name}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
            continue
        if err > 2e-2:
            rows.append({**row, "rel_error": err, "error": "wrong result"})
            print(f"  K{k} N{n} M{m} {name}: WRONG rel error {err:.3g}", file=sys.stderr)
            continue
        keep[name] = (fn, nsets, b, err)
    names = list(keep)
    timings = time_interleaved([v[0] for v in keep.values()], device, rounds=rounds, graph=True,
                               sets=[v[1] for v in keep.values()])
    copy = ceilings(device).copy_bytes_per_s
    by_name = dict(zip(names, timings, strict=True))
    bf16 = by_name["cuBLAS bf16"].median_s
    triton_s = by_name["triton (shipped)"].median_s if "triton (shipped)" in by_name else float("nan")
    for name, t in by_name.items():
        fn, nsets, b, err = keep[name]
        rows.append({"K": k, "N": n, "M": m, "passes": 1 + residual, "variant": name,
                     "us": t.median_s * 1e6, "spread": t.spread, "method": t.method,
                     "copy_share": b / t.median_s / copy, "vs_bf16": bf16 / t.median_s,
                     "vs_triton": t.median_s / triton_s, "rel_error": err})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,16,128,512,2048")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    ap.add_argument("--residual", action="store_true", help="also the residual pair at M = 1")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    todo = [(k, n, m, False) for k, n in shapes for m in ms]
    if args.residual:
        todo += [(k, n, 1, True) for k, n in shapes]
    rows = run_cases(todo, probe, args.rounds, args.json)
    table = [[r["K"], r["N"], r["M"], r["passes"], r["variant"],
              f"{r['us']:.1f} ±{100 * r['spread']:.0f}%" if "us" in r else r.get("error", ""),
              f"{100 * r['copy_share']:.0f}%" if "us" in r else "", f"{r['vs_bf16']:.2f}×" if "us" in r else "",
              f"{r['vs_triton']:.2f}×" if "us" in r else "", f"{r.get('rel_error', 0):.1e}"] for r in rows]
    print(tabulate(table, headers=["K", "N", "M", "P", "variant", "µs (graph)", "copy BW", "vs bf16",
                                   "÷ triton", "rel err"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
