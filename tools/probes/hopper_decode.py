"""Time the warp-level decode experiment (``hopper_decode_kernel.py``) beside
``hopper_wgmma``'s table plan and cuBLAS, and check it against the float64 golden (an
sm_90 GPU).

    python -m tools.probes.hopper_decode --shapes 4096x14336 --ms 1,8 --splits 2,4 --groups 1,2 [--depths 2,4] [--reads] [--cluster] [--json PATH]

CUDA graphs over rotating weights; GPTQ 4-bit g128 sym unless ``--bits``/``--group``/
``--asym``/``--fp16`` say otherwise. Each (split, K-groups) variant is compared with the
golden (relative error), with the table's plan, and with its own second run (bit for
bit). ``--reads`` also times each variant's loads without the work (``READ_ONLY`` 1–3:
with the x staging and split-K sum, without the sum, without either). ``--cluster`` also
times each split of 2, 4 or 8 programs (one K-group) as a thread-block cluster whose CTAs
sum their partials in its shared memory instead of the workspace.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import triton

from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.launch import prepare_x
from quantcore.backends.hopper_wgmma.layout import HopperWeights
from quantcore.backends.hopper_wgmma.small_m import close_slices
from quantcore.formats.gptq import GPTQ
from quantcore.timing import time_interleaved

from .hopper_decode_kernel import BM, decode_grid, decode_kernel
from .hopper_plan_times import SETS, weight_sets
from .probe_rows import record_times


def decode(x: torch.Tensor, w: HopperWeights, split: int, groups: int = 1, read_only: int = 0,
           depth: int = 2, cluster: bool = False) -> torch.Tensor:
    """``cluster``: the ``split`` programs of a tile are one thread-block cluster's CTAs,
    their partials summed in its shared memory (``cluster_sum_kernel.py``)."""
    m, k = x.shape
    n = w.out_features
    x2 = prepare_x(x)
    tiles = w.tiles
    steps, split = decode_grid(w.blocks, split, groups)
    if cluster and (split not in (2, 4, 8) or groups != 1):
        raise ValueError(f"a cluster takes 2, 4 or 8 programs of one K-group a tile; this grid has {split} "
                         f"programs of {groups}")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    ws = torch.empty(max(1, split) * m * n, dtype=torch.float32, device=x.device)
    cnt = w.runtime.setdefault("decode_counters", torch.zeros(tiles, dtype=torch.int32, device=x.device))
    bias = w.bias if w.bias is not None else w.scales
    zeros = w.zeros if w.zeros is not None else w.scales
    ranks = split if cluster else 1
    decode_kernel[(tiles, 1 if cluster else split)](
        w.qweight.view(torch.int16), x2, w.scales, zeros, bias, y, ws, cnt,
        m, n, k, x2.stride(0), y.stride(0), w.scales.shape[1], w.blocks, split,
        BITS=w.bits, SG=w.sub_group, CLOSE=close_slices(w), HAS_ZEROS=w.zeros is not None, HAS_BIAS=w.bias is not None,
        SPLIT=split > 1 and not cluster, EVEN_K=k % (128 if w.bits == 4 else 64) == 0, KW=groups, STEPS=steps,
        READ_ONLY=read_only, DEPTH=depth, CLUSTER=ranks, num_warps=4 * groups, num_ctas=ranks)
    return y


def run(shapes: list[tuple[int, int]], ms: list[int], splits: list[tuple[int, int, int, bool]], bits: int, group: int,
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
            for split, groups, depth, cluster in splits:
                name = (f"decode split {split} groups {groups}" + (f" depth {depth}" if depth != 2 else "")
                        + (" cluster" if cluster else ""))
                if m > BM:
                    continue
                try:
                    got = decode(x, prepared[0], split, groups, depth=depth, cluster=cluster).double()
                except Exception as exc:  # say what failed, time the rest
                    rows.append({"k": k, "n": n, "m": m, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
                    continue
                again = decode(x, prepared[0], split, groups, depth=depth, cluster=cluster).double()
                rows.append({"k": k, "n": n, "m": m, "variant": name,
                             "rel_err_golden": ((got - golden).norm() / golden.norm()).item(),
                             "rel_err_table": ((got - table).norm() / table.norm()).item(),
                             "repeat_identical": bool(torch.equal(got, again))})
                names.append(name)
                calls.append(lambda i, x=x, p=prepared, s=split, g=groups, d=depth, c=cluster:
                             decode(x, p[i % SETS], s, g, depth=d, cluster=c))
                sets.append(SETS)
                if read_only:  # the same reads without the work: what the loads alone cost
                    for level, what in ((1, "reads"), (2, "reads, no split-K sum"), (3, "reads alone")):
                        names.append(f"{name} {what}")
                        calls.append(lambda i, x=x, p=prepared, s=split, g=groups, r=level, d=depth, c=cluster:
                                     decode(x, p[i % SETS], s, g, r, d, c))
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
    p.add_argument("--cluster", action="store_true",
                   help="also time each split of 2, 4 or 8 with its sum in a thread-block cluster's shared memory")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    shapes = [(int(s.split("x")[0]), int(s.split("x")[1])) for s in a.shapes.split(",")]
    variants = [(int(s), int(h), int(d), False) for s in a.splits.split(",") for h in a.groups.split(",")
                for d in a.depths.split(",")]
    if a.cluster:
        variants += [(s, 1, d, True) for s, h, d, _ in variants if h == 1 and s in (2, 4, 8)]
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
