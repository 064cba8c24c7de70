"""Every path of the ``turboquant_triton`` kernel against cuBLAS bf16, per M, with several
launch configurations each (a developer's probe, CUDA): what ``configs.py`` ships comes
from here.

For each (K, N, M, passes): the decode kernel (M = 1), the tensor-core kernel, and
dequantize + cuBLAS, each checked against the float64 golden output and then timed as
CUDA-graph replays over weight sets that together exceed L2; cuBLAS bf16 on the same
shape in the same rounds. Rows go to ``--json``; a table is printed last.

    python -m tools.probes.turboquant_paths --part decode|mid16|mid128|prefill|fold|fold_mid|fold_small|all [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from tabulate import tabulate

from quantcore.backends.turboquant_triton import configs
from quantcore.backends.turboquant_triton.fused import fused_linear
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.benchmarks.ceilings import ceilings
from quantcore.benchmarks.memory import rotation_sets
from quantcore.benchmarks.suites.turboquant_linear import format_bytes
from quantcore.formats.turboquant import TurboQuant
from quantcore.timing import time_interleaved
from tools.probes.probe_rows import write_rows

DTYPE = torch.bfloat16
SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))
G = configs.GemvConfig
Mm = configs.MmaConfig
#: Decode-kernel configurations tried at M = 1: (groups a program, programs, rows a step, warps).
GEMV_VARIANTS = [G(8, 396, 8, 8, 3), G(8, 264, 8, 8, 3), G(8, 528, 8, 8, 3), G(4, 528, 8, 8, 3),
                 G(8, 396, 4, 4, 3)]
GEMV_VARIANTS_RES = [G(8, 264, 8, 8, 1), G(8, 132, 8, 8, 1), G(8, 396, 8, 8, 1)]
MMA_VARIANTS = {
    16: [Mm(64, 16, 4, 4, 3, 264), Mm(64, 16, 8, 4, 4, 264), Mm(128, 16, 4, 8, 3, 264), Mm(64, 16, 4, 4, 3, 528)],
    32: [], 64: [],  # (fold_small: the table's plan, as the wrapper's choice, is the one timed)
    128: [Mm(128, 32, 4, 4, 3, 264), Mm(128, 64, 4, 8, 3, 264), Mm(64, 64, 4, 4, 3, 264)],
    2048: [Mm(128, 64, 4, 8, 3, 132)],
}


def _weights(fmt: TurboQuant, k: int, n: int, sets: int, device: str) -> list[dict[str, torch.Tensor]]:
    """Quantized weights: one real quantization, then fresh random indices per set
    (distinct memory, same work) so the sets together exceed L2."""
    gen = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(n, k, device=device, generator=gen) * 0.02
    base = fmt.quantize(weight, generator=torch.Generator().manual_seed(0))
    out = [base]
    for _ in range(sets - 1):
        t = dict(base)
        for name in base:
            if name.endswith("indices"):
                t[name] = torch.randint(0, 256, base[name].shape, dtype=torch.uint8, device=device, generator=gen)
        out.append(t)
    return out


def _rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def probe(k: int, n: int, m: int, residual: bool, rounds: int, device: str = "cuda") -> list[dict[str, Any]]:
    fmt = TurboQuant(bits=4, group_size=128, residual=residual)
    nbytes = format_bytes(fmt, m, k, n)
    sets = rotation_sets(nbytes, device)
    weights = _weights(fmt, k, n, sets, device)
    kernel = TurboQuantTriton(fmt, device)
    prepared = [kernel.prepare(w, dtype=DTYPE) for w in weights]
    xs = [torch.randn(m, k, device=device, dtype=DTYPE) for _ in range(sets)]
    ref = xs[0].double() @ fmt.dequantize(weights[0]).T  # float64 golden, set 0
    dense = [torch.randn(n, k, device=device, dtype=DTYPE) for _ in range(rotation_sets(2 * k * n, device))]

    def call(path: str, cfg: Any) -> Callable[[int], torch.Tensor]:
        def run(i: int) -> torch.Tensor:
            p = prepared[i % sets]
            return fused_linear(xs[i % sets], p.passes, p.codebook, group_size=128, partial=None, bias=None,
                                out_dtype=DTYPE, path=path, config=cfg)
        return run

    variants: dict[str, tuple[Callable[[int], Any], int, int, str, Any]] = {}
    if m == 1:
        for cfg in GEMV_VARIANTS_RES if residual else GEMV_VARIANTS:
            variants[f"gemv {cfg.gpc}/{cfg.ctas}/{cfg.br}/{cfg.warps}"] = (call("gemv", cfg), sets, nbytes, "gemv", cfg)
        variants["mma 64x16"] = (call("mma", Mm(64, 16, 4, 4, 3, 264)), sets, nbytes, "mma", Mm(64, 16, 4, 4, 3, 264))
    else:
        for cfg in MMA_VARIANTS.get(m, MMA_VARIANTS[16] if m <= 16 else MMA_VARIANTS[128]) if m <= 2048 else ():
            name = f"mma {cfg.block_n}x{cfg.block_m} g{cfg.gpc} c{cfg.ctas} w{cfg.warps} s{cfg.stages}"
            variants[name] = (call("mma", cfg), sets, nbytes, "mma", cfg)
        if m >= 32:
            variants["dequant+cuBLAS"] = (call("dequant", None), sets, nbytes, "dequant", None)
            variants["fold+cuBLAS"] = (call("fold", None), sets, nbytes, "fold", None)
    variants["default (wrapper's choice)"] = (
        lambda i: kernel(xs[i % sets], prepared[i % sets]), sets, nbytes, "auto", None)
    variants["cuBLAS bf16"] = (lambda i: torch.nn.functional.linear(xs[i % len(xs)], dense[i % len(dense)]),
                               len(dense), 2 * (k * n + m * k + m * n), "peer", None)

    rows, keep = [], {}
    for name, (fn, nsets, b, path, cfg) in variants.items():
        try:
            y = fn(0)
            if device == "cuda":
                torch.cuda.synchronize()
            err = _rel_error(y, ref) if path != "peer" else 0.0
        except Exception as exc:  # a variant that fails is a row, not the end of the probe
            rows.append({"K": k, "N": n, "M": m, "passes": 1 + residual, "variant": name,
                         "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            print(f"  K{k} N{n} M{m} {name}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
            continue
        if err > 2e-2:
            rows.append({"K": k, "N": n, "M": m, "passes": 1 + residual, "variant": name, "rel_error": err,
                         "error": "wrong result"})
            print(f"  K{k} N{n} M{m} {name}: WRONG rel error {err:.3g}", file=sys.stderr)
            continue
        keep[name] = (fn, nsets, b, path, cfg, err)
    names = list(keep)
    timings = time_interleaved([v[0] for v in keep.values()], device, rounds=rounds, graph=True,
                               sets=[v[1] for v in keep.values()])
    copy = ceilings(device).copy_bytes_per_s
    bf16 = timings[names.index("cuBLAS bf16")].median_s
    for name, t in zip(names, timings, strict=True):
        fn, nsets, b, path, cfg, err = keep[name]
        if path != "peer":  # after hundreds of replays (split-K tickets reset each launch)
            err = max(err, _rel_error(fn(0), ref))
        rows.append({"K": k, "N": n, "M": m, "passes": 1 + residual, "variant": name, "path": path,
                     "config": dataclasses.asdict(cfg) if cfg is not None else None,
                     "us": t.median_s * 1e6, "spread": t.spread, "method": t.method,
                     "copy_share": b / t.median_s / copy, "vs_bf16": bf16 / t.median_s, "rel_error": err})
    return rows


PARTS = {
    "decode": [(k, n, 1, res) for res in (False, True) for k, n in SHAPES],
    "mid16": [(k, n, 16, False) for k, n in SHAPES] + [(4096, 14336, 16, True)],
    "mid128": [(k, n, 128, False) for k, n in SHAPES],
    "prefill": [(k, n, 2048, False) for k, n in SHAPES] + [(4096, 14336, 2048, True)],
    # the two prefill paths (dequantize every pass, or fold the rotations in) from the crossover on
    "fold": [(k, n, m, res) for m in (256, 2048, 8192) for k, n in SHAPES for res in (False, True)],
    "fold_mid": [(k, n, m, res) for m in (512, 1024) for k, n in SHAPES for res in (False, True)],
    # two passes below the tensor-core kernel's limit: is one GEMM of depth K already cheaper?
    "fold_small": [(k, n, m, True) for m in (32, 64, 128) for k, n in SHAPES],
}


def run_cases(todo: list[tuple[int, int, int, bool]], probe: Callable[..., list[dict[str, Any]]], rounds: int,
              json_path: str | None) -> list[dict[str, Any]]:
    """``probe(k, n, m, residual, rounds)`` for every case, the rows written after each."""
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for k, n, m, res in todo:
        rows += probe(k, n, m, res, rounds)
        print(f"  done K{k} N{n} M{m} res={res} at {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
        if json_path:
            write_rows(json_path, rows)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="all", choices=[*PARTS, "all"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    todo = [c for p, cases in PARTS.items() if args.part in (p, "all") for c in cases]
    rows = run_cases(todo, probe, args.rounds, args.json)
    table = [[r["K"], r["N"], r["M"], r["passes"], r["variant"],
              f"{r['us']:.1f} ±{100 * r['spread']:.0f}%" if "us" in r else r.get("error", ""),
              f"{100 * r['copy_share']:.0f}%" if "us" in r else "", f"{r['vs_bf16']:.2f}×" if "us" in r else "",
              f"{r.get('rel_error', 0):.1e}"] for r in rows]
    print(tabulate(table, headers=["K", "N", "M", "P", "variant", "µs (graph)", "copy BW", "vs bf16", "rel err"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
