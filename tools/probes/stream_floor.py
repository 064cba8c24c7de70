"""How fast can one kernel read a 4-bit weight's bytes at M = 1, and what does work per code cost?

Every int4 kernel here (``hopper_wgmma``, ``triton_int4``, tinygemm) takes about the same
time at M = 1 on a 4096×14336 weight on the H100 and the H200, although the H200 copies
1.4× faster. This separates the floor of the read from the cost of the work per code, on
the bytes of that weight (int32 words, ``[N, K/8]``, rotated over enough copies to exceed
L2), as CUDA-graph replays:

* ``read`` — a Triton kernel that only loads the words (``BLOCK_N`` rows per program, ``BK``
  words per step) and folds them with xor: the streaming floor of one launch;
* ``fma`` — the same walk doing what a CUDA-core GEMV must per code: one masked OR that
  makes an fp32 ``1 + q·2⁻⁸`` and one FMA with an activation value (8 codes per word);
* ``fma+scale`` — plus a per-group scale load and multiply, as a real GEMV does;
* ``torch sum`` / ``copy`` — torch's own reduction and copy of the same bytes;
* ``cuBLAS bf16`` — the dense layer at M = 1, for scale.

    python -m tools.probes.stream_floor [--k 4096] [--n 14336] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from quantcore.timing import time_interleaved


@triton.jit
def _walk(w_ptr, x_ptr, s_ptr, y_ptr, N, KW: tl.constexpr, WORK: tl.constexpr, BLOCK_N: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BK)
    base = w_ptr + rows[:, None].to(tl.int64) * KW + cols[None, :]
    if WORK == 0:
        acc = tl.zeros([BLOCK_N, BK], dtype=tl.int32)
    else:
        acc = tl.zeros([BLOCK_N, BK], dtype=tl.float32)
    for step in range(KW // BK):
        k0 = step * BK
        w = tl.load(base + k0, eviction_policy="evict_first")
        if WORK == 0:
            acc ^= w
        else:
            part = tl.zeros([BLOCK_N, BK], dtype=tl.float32)
            for f in tl.static_range(8):
                xf = tl.load(x_ptr + (k0 + cols) * 8 + f).to(tl.float32)
                code = (((w >> (4 * f)) & 15) << 15) | 0x3F800000
                part += code.to(tl.float32, bitcast=True) * xf[None, :]
            if WORK == 2:
                s = tl.load(s_ptr + (k0 // 16) * N + rows).to(tl.float32)
                acc += part * s[:, None]
            else:
                acc += part
    if WORK == 0:  # noqa: SIM108 - a constexpr branch: each arm is compiled alone
        out = tl.xor_sum(acc, axis=1).to(tl.float32)
    else:
        out = tl.sum(acc, axis=1)
    tl.store(y_ptr + rows, out)


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def run(k: int, n: int, sets: int) -> dict[str, Any]:
    dev = "cuda"
    kw = k // 8
    words = [torch.randint(-2**31, 2**31 - 1, (n, kw), dtype=torch.int32, device=dev) for _ in range(sets)]
    x = torch.randn(k, device=dev, dtype=torch.bfloat16)
    scales = [torch.rand(k // 128, n, device=dev, dtype=torch.bfloat16) + 0.5 for _ in range(sets)]
    y = torch.empty(n, device=dev, dtype=torch.float32)
    dense = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(max(2, sets // 4))]
    xd = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    sums = torch.empty(n, device=dev, dtype=torch.int64)
    dst = torch.empty_like(words[0])

    variants: list[tuple[str, dict[str, Any], Any, int]] = []
    for work, name in ((0, "read"), (1, "fma"), (2, "fma+scale")):
        for block_n, bk, warps in ((8, 64, 4), (16, 64, 4), (8, 128, 4), (16, 128, 8), (32, 64, 8), (4, 128, 4),
                                   (4, 256, 8), (2, 512, 8)):
            if n % block_n or kw % bk:
                continue
            cfg = {"block_n": block_n, "bk": bk, "num_warps": warps}

            def call(i: int, work: int = work, cfg: dict[str, int] = cfg) -> None:
                _walk[(n // cfg["block_n"],)](words[i % sets], x, scales[i % sets], y, n, kw, WORK=work,
                                              BLOCK_N=cfg["block_n"], BK=cfg["bk"], num_warps=cfg["num_warps"])

            variants.append((name, cfg, call, sets))
    variants.append(("torch sum", {}, lambda i: torch.sum(words[i % sets].view(torch.int64), dim=1, out=sums), sets))
    variants.append(("copy", {}, lambda i: dst.copy_(words[i % sets]), sets))
    variants.append(("cuBLAS bf16", {}, lambda i: torch.nn.functional.linear(xd, dense[i % len(dense)]), len(dense)))

    times = time_interleaved([v[2] for v in variants], dev, rounds=5, graph=True, sets=[v[3] for v in variants])
    read_bytes = _bytes(words[0])
    rows = []
    for (name, cfg, _, _), t in zip(variants, times, strict=True):
        nbytes = {"copy": 2 * read_bytes, "cuBLAS bf16": _bytes(dense[0])}.get(name, read_bytes)
        rows.append({"variant": name, "config": cfg, "us": t.median_s * 1e6, "spread": t.spread, "method": t.method,
                     "bytes": nbytes, "GB/s": nbytes / t.median_s / 1e9})
    return {"device": torch.cuda.get_device_name(), "k": k, "n": n, "sets": sets,
            "torch": torch.__version__, "triton": triton.__version__, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n", type=int, default=14336)
    p.add_argument("--sets", type=int, default=8, help="weight copies rotated over (their bytes must exceed L2)")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    res = run(a.k, a.n, a.sets)
    for r in res["rows"]:
        print(f"{r['variant']:12s} {json.dumps(r['config']):50s} {r['us']:8.2f} us {r['GB/s']:8.0f} GB/s")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
