"""Where the fused SVDQuant pre-GEMM's time goes: the whole op, the quantizer alone (the
same kernel compiled with rank 0: no LoRA, no partials), cuBLAS's LoRA-down alone and a
device copy of the op's bytes, as CUDA-graph replays in one process (an sm_90 GPU, a minute)::

    python -m tools.probes.act_quant_lora_parts [--m 4352] [--json PATH]
    python -m tools.probes.act_quant_lora_parts --ncu nvfp4,4352,3840,32   # one case, for ncu

The rank-0 rows run the shipped tile and a few others (more columns per step, more
programs an SM): if the quantizer alone streams near the copy rate, the LoRA half of the
step is what holds the op back; if not, the quantizer is. Codes and scales of every rank-0
row are compared bit for bit with the full op's (the LoRA does not touch them).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from quantcore.kernels.svdquant.base import SVDQuantWeights
from quantcore.kernels.svdquant.tile import Tile

from .act_quant_lora_plans import _kernel, _layer, baseline, copy_rate, op_bytes

__all__ = ["main", "quantizer_tiles"]

#: (N, R) of the suite's layers; M from ``--m`` (4352 by default).
LAYERS = [(n, r) for n in (3840, 10240) for r in (32, 128)]


def quantizer_tiles(base: Tile) -> list[Tile]:
    """The shipped tile, then variants of it for the quantizer alone."""
    rep = dataclasses.replace
    out = [base, rep(base, bn=128), rep(base, num_warps=8), rep(base, bn=128, num_warps=8),
           rep(base, per_sm=4, maxnreg=128), rep(base, num_stages=4), rep(base, bm=32, per_sm=4, maxnreg=128)]
    return list(dict.fromkeys(out))


def _rank0(prepared: SVDQuantWeights) -> SVDQuantWeights:
    return dataclasses.replace(prepared, lora_down=prepared.lora_down[:, :0].contiguous())


def _quantize(kernel: Any, xs: list[torch.Tensor], prepared: SVDQuantWeights, tile: Tile, i: int) -> object:
    return kernel.forward(xs[i % len(xs)], prepared, tile=tile)


def run_case(fp4: bool, m: int, n: int, r: int, copy: float, gen: torch.Generator, *,
             variants: bool) -> list[dict[str, Any]]:
    """One case; ``variants``: the quantizer alone on every tile of :func:`quantizer_tiles`, else on the shipped one."""
    from quantcore.timing import time_interleaved

    kernel = _kernel(fp4)
    layer = _layer(n, r, gen)
    prepared = kernel.prepare(layer, dtype=torch.bfloat16)
    quant_only = _rank0(prepared)
    sets = max(2, min(64, -(-(100 << 20) // (2 * m * n))))
    xs = [(torch.randn(m, n, generator=gen) * 2).to("cuda", torch.bfloat16) for _ in range(sets)]
    base = baseline(fp4, m, n, r)
    full = kernel.forward(xs[0], prepared, tile=base)
    nbytes, q_bytes = op_bytes(fp4, m, n, r), op_bytes(fp4, m, n, 0)
    src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    names: list[tuple[str, Tile | None, int]] = [("cublas_lora_down", None, nbytes), ("copy", None, nbytes),
                                                 ("full", base, nbytes)]
    fns: list[Callable[[int], object]] = [lambda i: xs[i % sets] @ layer["lora_down"], lambda i: dst.copy_(src),
                                          lambda i: kernel.forward(xs[i % sets], prepared, tile=base)]
    rows: list[dict[str, Any]] = []
    for tile in quantizer_tiles(base) if variants else [base]:
        try:
            out = kernel.forward(xs[0], quant_only, tile=tile)
            torch.cuda.synchronize()
        except Exception as exc:
            rows.append({"fmt": "nvfp4" if fp4 else "int4", "M": m, "N": n, "R": r, "part": "quantizer",
                         "tile": tile.describe(), "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            continue
        exact = torch.equal(out.qout, full.qout) and torch.equal(out.oscales.view(torch.uint8),
                                                                  full.oscales.view(torch.uint8))
        names.append((f"quantizer{'' if exact else ' (CODES DIFFER)'}", tile, q_bytes))
        fns.append(functools.partial(_quantize, kernel, xs, quant_only, tile))
    timings = time_interleaved(fns, "cuda", rounds=5, graph=True, sets=[sets, 1, sets, *[sets] * (len(fns) - 3)])
    for (part, timed_tile, b), timing in zip(names, timings, strict=True):
        rows.append({"fmt": "nvfp4" if fp4 else "int4", "M": m, "N": n, "R": r, "part": part,
                     "tile": timed_tile.describe() if timed_tile else "", "us": timing.median_s * 1e6, "bytes": b,
                     "copy_share": b / timing.median_s / copy, "method": timing.method})
    return rows


def ncu_target(spec: str) -> int:
    """Three calls of one case's full op (``fmt,M,N,R``): ``ncu -k regex:act_quant -s 2 -c 1``."""
    fmt, m, n, r = spec.split(",")
    fp4 = fmt == "nvfp4"
    kernel = _kernel(fp4)
    gen = torch.Generator().manual_seed(0)
    prepared = kernel.prepare(_layer(int(n), int(r), gen), dtype=torch.bfloat16)
    if int(r) == 0:
        prepared = _rank0(prepared)
    x = (torch.randn(int(m), int(n), generator=gen) * 2).to("cuda", torch.bfloat16)
    for _ in range(3):
        kernel.forward(x, prepared, tile=baseline(fp4, int(m), int(n), max(int(r), 32)))
    torch.cuda.synchronize()
    return 0


def main(out: Path | None, m: int) -> int:
    copy = copy_rate()
    gen = torch.Generator().manual_seed(1)
    rows: list[dict[str, Any]] = []
    for fp4 in (True, False):
        for n, r in LAYERS:
            part = run_case(fp4, m, n, r, copy, gen, variants=(n, r) == (3840, 32))
            rows += part
            for row in part:
                what = f"{row['us']:7.1f} µs {row['copy_share']:5.0%}" if "us" in row else f"FAIL {row['error']}"
                print(f"{row['fmt']:5s} M{m} N{n} R{r} {row['part']:18s} {what}  {row['tile']}", flush=True)
            torch.cuda.empty_cache()
    if out is not None:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bytes_per_s": copy}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--ncu", default=None, help="fmt,M,N,R: three calls of one case, for ncu")
    parser.add_argument("--m", type=int, default=4352, help="activation rows")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("act_quant_lora_parts: needs a CUDA GPU")
    sys.exit(ncu_target(args.ncu) if args.ncu else main(args.json, args.m))
