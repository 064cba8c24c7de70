"""Is a decode tile's split-K sum cheaper through a thread-block cluster's shared memory
than through global memory? (an sm_90 GPU, one call, well under a minute)

    python -m tools.probes.cluster_sum [--tiles 224] [--ranks 2,4] [--json PATH]

Over the decode kernels' grid (``tiles`` 64-row output tiles, ``ranks`` programs a tile;
224 tiles is N = 14336) it times, as CUDA-graph replays over rotating partials
(``cluster_sum_kernel.py``): each program storing its partial and nothing more (the floor),
the sum through the workspace and a ticket a tile (the decode kernels' today), and the sum
through the cluster's shared memory. Both sums are checked against the float64 sum and
against each other bit for bit (both add the ranks in order). What each sum costs is its
time over the floor's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import triton

from quantcore.timing import time_interleaved

from .cluster_sum_kernel import BM, BN, cluster_kernel, floor_kernel, ticket_kernel

#: Partial sets the calls rotate over (each 224 × 4 × 2 KB: together more than L1, as the
#: walk's partials would not be in L1 either).
SETS = 4


def _variants(tiles: int, ranks: int, parts: list[torch.Tensor]) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    n = tiles * int(BN)
    dev = parts[0].device
    y_cluster = torch.empty(int(BM), n, device=dev)
    y_ticket = torch.empty(int(BM), n, device=dev)
    ws = torch.empty(ranks * int(BM) * n, device=dev)
    tickets = torch.zeros(tiles, dtype=torch.int32, device=dev)
    calls = {
        "each program stores its partial (floor)": lambda i: floor_kernel[(tiles, ranks)](
            parts[i % SETS], ws, n, RANKS=ranks, num_warps=4),
        "sum through global memory and a ticket": lambda i: ticket_kernel[(tiles, ranks)](
            parts[i % SETS], y_ticket, ws, tickets, y_ticket.stride(0), n, RANKS=ranks, num_warps=4),
        "sum through the cluster's shared memory": lambda i: cluster_kernel[(tiles,)](
            parts[i % SETS], y_cluster, y_cluster.stride(0), RANKS=ranks, num_warps=4, num_ctas=ranks),
    }
    return calls, y_ticket, y_cluster


def run(tiles: int, ranks_list: list[int], rounds: int) -> dict[str, Any]:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict[str, Any]] = []
    for ranks in ranks_list:
        parts = [torch.randn(tiles, ranks, int(BN), int(BM), device=dev, generator=gen) for _ in range(SETS)]
        calls, y_ticket, y_cluster = _variants(tiles, ranks, parts)
        names = list(calls)
        check: dict[str, Any] = {}
        try:
            calls[names[1]](0)
            calls[names[2]](0)
            torch.cuda.synchronize()
            golden = parts[0].double().sum(1).permute(2, 0, 1).reshape(int(BM), -1)
            check = {"rel_err_ticket": ((y_ticket.double() - golden).norm() / golden.norm()).item(),
                     "rel_err_cluster": ((y_cluster.double() - golden).norm() / golden.norm()).item(),
                     "cluster_equals_ticket": bool(torch.equal(y_ticket, y_cluster))}
        except Exception as exc:  # say what failed; the floor and the tickets are still timed
            check = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            names = names[:2]
        times = time_interleaved([calls[n] for n in names], "cuda", rounds=rounds, graph=True, sets=[SETS] * len(names))
        floor = times[0].median_s
        for name, t in zip(names, times, strict=True):
            rows.append({"tiles": tiles, "ranks": ranks, "variant": name, "us": t.median_s * 1e6,
                         "over_floor_us": (t.median_s - floor) * 1e6, "spread": t.spread, "method": t.method})
        rows.append({"tiles": tiles, "ranks": ranks, "variant": "check", **check})
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiles", type=int, default=224)
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    res = run(a.tiles, [int(r) for r in a.ranks.split(",")], a.rounds)
    for r in res["rows"]:
        if r["variant"] == "check":
            print(f"ranks {r['ranks']}: {json.dumps({k: v for k, v in r.items() if k not in ('tiles', 'ranks', 'variant')})}")
        else:
            print(f"ranks {r['ranks']}  {r['variant']:42s} {r['us']:7.2f} us  (+{r['over_floor_us']:.2f} over the floor)")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
