"""Is the 256-row fp16 tile's garbage the register-operand wgmma hazard? On a CUDA GPU, at
the format's reference shape (E = 8, top-2, K = 4096, N = 28672, T = 4096), for fp16
scales in groups of 64 and 128: each tile pre-scaled (what the H100 computed wrong) and
post-scaled (what ``check_tile`` requires on sm_90), with

- the number of A-register writes under a pending wgmma in its sm_90a SASS
  (:mod:`quantcore.triton.wgmma_hazards`, compiled here with the bundled ptxas);
- through the kernel's own call with the tile forced: its relative error against a float32
  reference over ``--repeats`` calls, or the refusal ``check_tile`` gives (what a caller
  forcing a pre-scaled fp16 tile on sm_90 gets);
- for the post-scaled tiles, the time beside the bf16 tile the H100 ships (CUDA graphs).

Expected: every tile the check lets through (post-scaled) without hazards and right in
every call; every pre-scaled fp16 tile refused, with hazards > 0 in its SASS.

    python -m tools.probes.trtllm_moe_wgmma_hazard [--out FILE] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from quantcore.backends.trtllm_moe.tiles import NARROW, MoETile, pick_tile
from quantcore.errors import KernelInputError
from quantcore.probe.card import card_key

from .trtllm_moe_tiles import GROUP, TOPK, E, K, _routing, _weights, bench, reference

T = 4096
#: The failing tile of the sweep, the shipped 256-row tile, the 128-row one fp16 runs, a decode tile.
TILES = {
    "persistent-256": MoETile(256, 128, 64, 8, 4, scheduled=True, scale_pairs=False),
    "wide-256": MoETile(256, 128, 64, 8, 4, scheduled=True, persistent=0, split_tail=True),
    "narrow-128": NARROW,
    "decode-16": MoETile(16, 64, 64, 4, 4, scheduled=True, persistent=0),
}


def _hazards(tile: MoETile, group: int) -> int:
    from tools.compile_report.trtllm_moe_triton import compile_one

    return int(compile_one(tile, dtype="fp16", group=group)["wgmma_hazards"])


def _call(kernel: Any, x: torch.Tensor, ids: torch.Tensor, prepared: Any, tile: MoETile) -> torch.Tensor:
    """``[T, TOPK, N]`` through ``tile`` (the kernel's own call, the tile forced)."""
    return kernel.forward(x, ids.to(torch.int32), prepared, tile=tile)  # type: ignore[no-any-return]


def main(out: Path, repeats: int) -> list[dict[str, Any]]:
    from quantcore.backends.trtllm_moe.triton_kernel import TritonMoE
    from quantcore.formats.trtllm_moe import TRTLLMMoE

    card = card_key(0)
    print(f"{torch.cuda.get_device_name()} ({card.slug})", flush=True)
    ids = _routing(T, 1)
    x32 = torch.randn(T, K, device="cuda")
    rows: list[dict[str, Any]] = []
    for group in (64, 128):
        w = _weights(True, torch.float16, group, seed=5)
        kernel = TritonMoE(TRTLLMMoE(group_size=group, sym=True, scale_dtype=torch.float16), "cuda")
        prepared = kernel.prepare(w, dtype=torch.float16)
        x = x32.to(torch.float16)
        ref = reference(x, ids, w, group)
        for name, base in TILES.items():
            for pre in (True, False):
                tile = replace(base, pre_scale=pre, bk=min(base.bk, group))
                errors = []
                row = {"group": group, "tile": name, "pre_scale": pre, "spec": tile.describe(),
                       "sass_hazards": _hazards(tile, group)}
                try:
                    for _ in range(repeats):
                        y = _call(kernel, x, ids, prepared, tile).float()
                        errors.append(float((y - ref).norm() / ref.norm()))
                except KernelInputError as exc:  # the tile check refuses it: what a user would get
                    row["refused"] = str(exc)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    continue
                row.update(rel_errors=errors, wrong_calls=sum(not e < 4e-3 for e in errors))
                if not pre:
                    row["ms"] = bench(lambda t=tile, x=x, p=prepared, k=kernel: _call(k, x, ids, p, t))
                rows.append(row)
                print(json.dumps(row), flush=True)
        del w, prepared, ref
        torch.cuda.empty_cache()
    # the bf16 tile the card ships, for the cost of post-scaling fp16
    w = _weights(True, torch.bfloat16, GROUP, seed=5)
    kernel = TritonMoE(TRTLLMMoE(group_size=GROUP, sym=True, scale_dtype=torch.bfloat16), "cuda")
    prepared = kernel.prepare(w, dtype=torch.bfloat16)
    tile = pick_tile(T * TOPK, E, K, GROUP, scale_dtype=torch.bfloat16, card=card)
    xb = x32.to(torch.bfloat16)
    rows.append({"group": GROUP, "tile": "bf16 shipped", "spec": tile.describe(),
                 "ms": bench(lambda: _call(kernel, xb, ids, prepared, tile))})
    print(json.dumps(rows[-1]), flush=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "card": card.slug, "T": T, "rows": rows},
                              indent=1))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("trtllm_moe_wgmma_hazard.json"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    main(args.out, args.repeats)
