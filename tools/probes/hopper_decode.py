"""Time the warp-level decode kernel (``backends/hopper_wgmma/decode.py``) in its variants
beside ``hopper_wgmma``'s table plan and cuBLAS, and check it against the float64 golden
(an sm_90 GPU).

    python -m tools.probes.hopper_decode --shapes 4096x14336 --ms 1,8 --splits 2,4 --groups 1,2 [--depths 2,4] [--reads] [--json PATH]

CUDA graphs over rotating weights; GPTQ 4-bit g128 sym unless ``--bits``/``--group``/
``--asym``/``--fp16`` say otherwise. Each (split, K-groups) variant is compared with the
golden (relative error), with the table's plan, and with its own second run (bit for
bit). ``--reads`` also times each variant's loads without the work (``READ_ONLY`` 1–3:
with the x staging and split-K sum, without the sum, without either). (A split-K sum
through a thread-block cluster's shared memory was measured with this probe and not kept:
``backends/hopper_wgmma/README.md``.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import triton

from quantcore.backends.hopper_wgmma.decode import BM, decode_grid, decode_kernel, whole_runs
from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.launch import prepare_x
from quantcore.backends.hopper_wgmma.layout import HopperWeights
from quantcore.backends.hopper_wgmma.small_m import close_slices
from quantcore.formats.gptq import GPTQ
from quantcore.timing import time_interleaved

from .hopper_plan_times import SETS, weight_sets
from .probe_rows import record_times


def decode(x: torch.Tensor, w: HopperWeights, split: int, groups: int = 1, read_only: int = 0,
           depth: int = 2) -> torch.Tensor:
    """One launch of a variant (Triton's own launch path, a fresh workspace)."""
    m, k = x.shape
    n = w.out_features
    x2 = prepare_x(x)
    tiles = w.tiles
    steps, split = decode_grid(w.blocks, split, groups)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    ws = torch.empty(max(1, split) * m * n, dtype=torch.float32, device=x.device)
    cnt = w.runtime.setdefault("decode_counters", torch.zeros(tiles, dtype=torch.int32, device=x.device))
    bias = w.bias if w.bias is not None else w.scales
    zeros = w.zeros if w.zeros is not None else w.scales
    decode_kernel[(tiles, split)](
        w.qweight.view(torch.int16), x2, w.scales, zeros, bias, y, ws, cnt,
        m, n, k, x2.stride(0), y.stride(0), w.scales.shape[1], w.blocks, split,
        w.scales, w.scales, cnt, 0,  # no rotation: its x, rotation, counts and rows unused
        BITS=w.bits, SG=w.sub_group, CLOSE=close_slices(w), HAS_ZEROS=w.zeros is not None, HAS_BIAS=w.bias is not None,
        SPLIT=split > 1, EVEN_K=whole_runs(k, w.bits, w.blocks, steps, groups), KW=groups, STEPS=steps,
        READ_ONLY=read_only, DEPTH=depth, ROWS=8 if m <= 8 else 16, num_warps=4 * groups)
    return y


def run(shapes: list[tuple[int, int]], ms: list[int], splits: list[tuple[int, int, int]], bits: int, group: int,
        sym: bool, dtype: torch.dtype, read_only: bool = False) -> dict[str, Any]:
    dev = torch.device("cuda")
    fmt = GPTQ(bits=bits, group_size=group, sym=sym)
    kernel = HopperWgmmaGPTQ(fmt, dev)
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    for k, n in shapes:
        stored, prepared, dense = weight_sets(kernel, k, n, gen, dtype)
        golden_w = fmt.dequantize({a: t.to(dev) for a, t in stored[0].items()})
        for m in ms:
            x = torch.randn(m, k, generator=gen).to(dev, dtype)
            golden = x.double() @ golden_w.T
            table = kernel(x, prepared[0]).double()
            names = ["table's plan", "cuBLAS"]
            calls: list[Any] = [lambda i, x=x, p=prepared: kernel(x, p[i % SETS]),
                                lambda i, x=x, d=dense: torch.nn.functional.linear(x, d[i % 3])]
            sets = [SETS, 3]
            rows.append({"k": k, "n": n, "m": m, "variant": "table's plan",
                         "rel_err_golden": ((table - golden).norm() / golden.norm()).item()})
            for split, groups, depth in splits:
                name = f"decode split {split} groups {groups}" + (f" depth {depth}" if depth != 2 else "")
                if m > BM:
                    continue
                try:
                    got = decode(x, prepared[0], split, groups, depth=depth).double()
                except Exception as exc:  # say what failed, time the rest
                    rows.append({"k": k, "n": n, "m": m, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
                    continue
                again = decode(x, prepared[0], split, groups, depth=depth).double()
                rows.append({"k": k, "n": n, "m": m, "variant": name,
                             "rel_err_golden": ((got - golden).norm() / golden.norm()).item(),
                             "rel_err_table": ((got - table).norm() / table.norm()).item(),
                             "repeat_identical": bool(torch.equal(got, again))})
                names.append(name)
                calls.append(lambda i, x=x, p=prepared, s=split, g=groups, d=depth:
                             decode(x, p[i % SETS], s, g, depth=d))
                sets.append(SETS)
                if read_only:  # the same reads without the work: what the loads alone cost
                    for level, what in ((1, "reads"), (2, "reads, no split-K sum"), (3, "reads alone")):
                        names.append(f"{name} {what}")
                        calls.append(lambda i, x=x, p=prepared, s=split, g=groups, r=level, d=depth:
                                     decode(x, p[i % SETS], s, g, r, d))
                        sets.append(SETS)
            times = time_interleaved(calls, "cuda", rounds=5, graph=True, sets=sets)
            record_times(rows, names, times, {"k": k, "n": n, "m": m})
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "bits": bits, "group": group, "sym": sym, "dtype": str(dtype), "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x14336")
    p.add_argument("--ms", default="1")
    p.add_argument("--splits", default="2,4", help="programs splitting K, each timed at every --groups")
    p.add_argument("--groups", default="1", help="K-groups of four warps a program (summed in shared memory)")
    p.add_argument("--depths", default="2", help="steps in flight a warp (2 or 4), each timed at every split")
    p.add_argument("--bits", type=int, default=4, choices=(4, 8))
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--asym", action="store_true")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--reads", action="store_true", help="also time each split's reads alone")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    shapes = [(int(s.split("x")[0]), int(s.split("x")[1])) for s in a.shapes.split(",")]
    variants = [(int(s), int(h), int(d)) for s in a.splits.split(",") for h in a.groups.split(",")
                for d in a.depths.split(",")]
    res = run(shapes, [int(m) for m in a.ms.split(",")], variants, a.bits, a.group,
              not a.asym, torch.float16 if a.fp16 else torch.bfloat16, a.reads)
    for r in res["rows"]:
        extra = r.get("error") or (f"{r.get('us', float('nan')):8.2f} us  {r.get('x_cublas', 0):5.2f}x  "
                                   f"golden {r.get('rel_err_golden', 0):.1e} table {r.get('rel_err_table', 0):.1e} "
                                   f"same twice {r.get('repeat_identical', '-')}")
        print(f"{r['k']:6d}x{r['n']:<6d} M{r['m']:<3d} {r['variant']:24s} {extra}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
