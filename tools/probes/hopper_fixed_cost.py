"""Where ``hopper_wgmma``'s fixed cost at M = 1 goes (an sm_90 GPU, one call, ~1 minute).

Every shape pays about 5.5 µs over its bytes at M = 1, where a plain Triton read of the
same bytes pays about 1.5 (``stream_floor.py``; ``backends/hopper_wgmma/README.md``).
This times, as CUDA-graph replays over rotating weights, with N = 14336 and the same
grid for every K (224 tiles of 64 rows):

* the kernel at K = 128, 256, 512, 1024 and 4096 (1 … 32 blocks a tile), K split 1 and 2,
  rings of 2 and 8 stages — the intercept over K is the fixed cost, the split's
  difference the split-K reduction's, the ring's difference its setup and first fill;
* ``stream_floor``'s read of each K's bytes, and an empty Triton kernel on the kernel's
  grid (its launch and the grid's ramp alone).

    python -m tools.probes.hopper_fixed_cost [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.launch import linear
from quantcore.backends.hopper_wgmma.plans import Plan
from quantcore.benchmarks.memory import with_fresh_codes
from quantcore.formats.gptq import GPTQ
from quantcore.timing import time_interleaved

from .stream_floor import _walk

N = 14336
KS = (128, 256, 512, 1024, 4096)
SETS = 8


@triton.jit
def _empty(out_ptr):
    if tl.program_id(0) < 0:  # never: a launch whose programs do nothing
        tl.store(out_ptr, 0)


def run() -> dict[str, Any]:
    dev = torch.device("cuda")
    fmt = GPTQ(bits=4, group_size=128, sym=True)
    kernel = HopperWgmmaGPTQ(fmt, dev)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, max(KS), generator=gen).to(dev, torch.bfloat16)
    out = torch.empty(1, device=dev)
    names: list[str] = []
    calls: list[Any] = []
    sets: list[int] = []
    for k in KS:
        stored = with_fresh_codes(fmt.quantize(torch.randn(N, k, generator=gen) * 0.02, generator=gen), SETS, gen)
        prepared = [kernel.prepare({a: t.to(dev) for a, t in one.items()}) for one in stored]
        blocks = k // 128
        for split in (1, 2):
            for stages in (2, 8):
                if split > blocks or (blocks // split) % 2:
                    continue
                plan = Plan(1, 8, stages, split, in_flight=True)
                names.append(f"K{k} split {split} stages {stages}")
                calls.append(lambda i, p=prepared, plan=plan, k=k: linear(x[:, :k], p[i % SETS], plan))
                sets.append(SETS)
        words = [torch.randint(-2**31, 2**31 - 1, (N, k // 8), dtype=torch.int32, device=dev) for _ in range(SETS)]
        scales = torch.ones(max(1, k // 128), N, device=dev, dtype=torch.bfloat16)
        y = torch.empty(N, device=dev)
        bk = min(64, k // 8)
        names.append(f"K{k} read")
        calls.append(lambda i, w=words, s=scales, y=y, k=k, bk=bk: _walk[(N // 8,)](
            w[i % SETS], x, s, y, N, k // 8, WORK=0, BLOCK_N=8, BK=bk, num_warps=4))
        sets.append(SETS)
    for grid in (224, 448):
        names.append(f"empty kernel, {grid} programs")
        calls.append(lambda i, grid=grid: _empty[(grid,)](out, num_warps=4))
        sets.append(1)
    times = time_interleaved(calls, "cuda", rounds=5, graph=True, sets=sets)
    return {"device": torch.cuda.get_device_name(), "n": N, "torch": torch.__version__, "triton": triton.__version__,
            "rows": [{"variant": name, "us": t.median_s * 1e6, "spread": t.spread, "method": t.method}
                     for name, t in zip(names, times, strict=True)]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    res = run()
    for r in res["rows"]:
        print(f"{r['variant']:36s} {r['us']:8.2f} us")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
