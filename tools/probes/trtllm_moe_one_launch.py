"""Should a scheduled ``trtllm_moe_triton`` call be one launch (each program finds its
tile's routes in the ids) or two (the scheduling kernel sorts them first), and up to how
many routes (``tiles.ONE_LAUNCH_MAX_ROUTES``)? At E = 8, top-2, K = 4096, N = 28672, plain
and gated (SwiGLU: 14336 columns out), T = 128, 512, 1024, 4096, on one CUDA GPU:

1. each path's output against the other's, bit for bit, also with stray ids (NaN rows
   where they go, the same elsewhere), and against the float64 golden: a difference is
   printed as ``FAIL`` and the exit status is 1;
2. CUDA-graph replay µs and eager host µs per call (a queue of calls, one
   synchronisation) of both paths, the default call (with its checks) and ``nn.Linear``
   of the same M, K and N out, in the same process.

    python -m tools.probes.trtllm_moe_one_launch [--out FILE.json] [--t 128,512,1024,4096]

(``TRITON_INTERPRET=1 ... --device cpu --kn 128,256 --t 70,600 --calls 2`` runs it under
Triton's interpreter at a small shape: a check of the probe itself, its times are the
interpreter's.)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace

import torch

from quantcore.backends.trtllm_moe import TritonMoE
from quantcore.backends.trtllm_moe.tiles import ONE_LAUNCH_MAX_ROUTES, MoETile, pick_tile
from quantcore.benchmarks.suites._host_cost import host_times
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.ops.moe import moe_gemm_reference, swiglu
from quantcore.probe.card_tables import card_of
from quantcore.timing import time_interleaved

E, TOPK = 8, 2
FMT = TRTLLMMoE(group_size=128, sym=True, scale_dtype=torch.bfloat16)
TOL = 2 * 2.0**-8


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


class _Dense:
    """Expert e's dense weight on demand (the whole [E, K, N] in float64 would not fit)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def __getitem__(self, e: int) -> torch.Tensor:
        one = {k: v[e:e + 1] for k, v in self.tensors.items()}
        return FMT.dequantize(one)[0]


def _subjects(kernel: TritonMoE, w: object, x: torch.Tensor, ids: torch.Tensor, one: MoETile, two: MoETile,
              gated: bool, linear: torch.nn.Module) -> dict[str, Callable[[int], object]]:
    """What is timed: both paths through ``forward`` (no checks), the default call, and
    ``nn.Linear`` on the same activation."""
    return {
        "one launch": lambda i: kernel.forward(x, ids, w, tile=one, gated=gated),
        "two launches": lambda i: kernel.forward(x, ids, w, tile=two, gated=gated),
        "default call": (lambda i: kernel.gated(x, ids, w)) if gated else (lambda i: kernel(x, ids, w)),
        "nn.Linear": lambda i: linear(x),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.trtllm_moe_one_launch")
    parser.add_argument("--out", default="trtllm_moe_one_launch.json")
    parser.add_argument("--t", default="128,512,1024,4096")
    parser.add_argument("--kn", default="4096,28672", help="K and N (N: the plain GEMM's columns)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--calls", type=int, default=64, help="eager calls queued per host sample")
    args = parser.parse_args(argv)
    k, n = (int(v) for v in args.kn.split(","))
    dev = torch.device(args.device, 0) if args.device == "cuda" else torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(0)
    tensors = {"qweight": torch.randint(-128, 128, (E, k, n), dtype=torch.int8, generator=gen, device=dev),
               "scales": (torch.rand(E, k // FMT.group_size, n, generator=gen, device=dev) * 2e-4 + 1e-4).bfloat16()}
    kernel = TritonMoE(FMT, dev)
    w = kernel.prepare(tensors, dtype=torch.bfloat16)
    dense = _Dense(tensors)
    cuda = dev.type == "cuda"
    out: dict = {"device_name": torch.cuda.get_device_name(dev) if cuda else str(dev),
                 "one_launch_max_routes": ONE_LAUNCH_MAX_ROUTES, "shape": {"E": E, "topk": TOPK, "K": k, "N": n},
                 "unit": "µs", "rows": [], "failures": []}
    for t in (int(v) for v in args.t.split(",")):
        routes = t * TOPK
        base = pick_tile(routes, E, k, FMT.group_size, scale_dtype=torch.bfloat16, card=card_of(dev),
                         interpreted=not cuda)
        one, two = replace(base, schedule_kernel=False, x_sorted=False), replace(base, schedule_kernel=True)
        x = torch.randn(t, k, generator=gen, device=dev).bfloat16()
        ids = torch.rand(t, E, generator=gen, device=dev).argsort(dim=1)[:, :TOPK].to(torch.int32)
        stray = ids.clone()
        stray.view(-1)[:: max(1, routes // 7)] = -1  # a few routes: -1, E, 2³¹ − 1
        stray.view(-1)[3:: max(1, routes // 5)] = E
        stray.view(-1)[-1] = 2**31 - 1
        gold = moe_gemm_reference(x, ids, dense)
        for gated in (False, True):
            name = f"T{t}{'-gated' if gated else ''}"
            y1 = kernel.forward(x, ids, w, tile=one, gated=gated)
            y2 = kernel.forward(x, ids, w, tile=two, gated=gated)
            s1 = kernel.forward(x, stray, w, tile=one, gated=gated)
            s2 = kernel.forward(x, stray, w, tile=two, gated=gated)
            bad = stray != ids
            rel = _rel(y1, swiglu(gold) if gated else gold)
            checks = {"one == two": _same(y1, y2), "stray: one == two": _same(s1, s2),
                      "stray rows NaN": bool(s1[bad].isnan().all()), "other rows finite": bool(s1[~bad].isfinite().all()),
                      f"golden rel {rel:.2e} < {TOL:.1e}": rel < TOL}
            for what, ok in checks.items():
                if not ok:
                    out["failures"].append(f"{name}: {what}")
                    print(f"FAIL {name}: {what}", flush=True)
            linear = torch.nn.Linear(k, n // 2 if gated else n, bias=False, device=dev, dtype=torch.bfloat16)
            things = _subjects(kernel, w, x, ids, one, two, gated, linear)
            with torch.inference_mode():
                graph = time_interleaved(list(things.values()), dev.type, rounds=7 if cuda else 1, graph=cuda)
                host = host_times(list(things.values()), dev, rounds=5 if cuda else 1, calls=args.calls)
            row = {"T": t, "gated": gated, "routes": routes, "tile": one.describe(), "checks": checks,
                   "graph_us": {k: g.median_s * 1e6 for k, g in zip(things, graph, strict=True)},
                   "graph_spread": {k: g.spread for k, g in zip(things, graph, strict=True)},
                   "host_us": {k: h[0].median_s * 1e6 for k, h in zip(things, host, strict=True)},
                   "wall_us": {k: h[1] * 1e6 for k, h in zip(things, host, strict=True)}}
            out["rows"].append(row)
            lin_host = row["host_us"]["nn.Linear"]
            print(name, "graph µs", {k: round(v, 1) for k, v in row["graph_us"].items()},
                  "| host µs (× nn.Linear)", {k: f"{v:.1f} ({v / lin_host:.2f}×)" for k, v in row["host_us"].items()},
                  flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print("FAILED:" if out["failures"] else "all checks passed", *out["failures"], sep="\n  ")
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
