"""Launch shapes of the Triton MoE kernel: what a tile is, the rules it must keep, and
the shipped choice per device (no autotuning on a user's first call).

The choice depends on everything that changes the kernel's geometry: the routes per
expert the call can expect (``R / E``: M per expert), N, K and the group size (a K-tile
lies inside one group and divides K), symmetric or not, and the device. The compiled
kernel is further specialised by Triton on every constexpr (K, group, tile, dtype,
variant flags), so a new shape compiles once and never reuses another's binary.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from quantcore.errors import InvalidArgumentError, KernelInputError
from quantcore.files import read_json

__all__ = ["CHUNK", "ENV_TABLE", "NARROW", "SMALL_MAX_ROUTES", "MoETile", "check_tile", "pick_tile", "tile_table"]

CHUNK = 64  # K rows per interleaved column tile of the layout
#: Up to this many routes the kernel finds each expert's routes itself (one launch);
#: more are sorted by a scheduling kernel first.
SMALL_MAX_ROUTES = 128


@dataclass(frozen=True)
class MoETile:
    """``bm`` routes × ``bn`` weight columns per tile, ``bk`` K rows per step.

    ``scheduled``: a tile scheduler over (expert, M-tile, N-tile) with ``persistent``
    programs per SM (0: one program per tile) — prefill; otherwise each program finds
    its expert's routes in the kernel — decode. ``x_sorted``: read a permuted copy of the
    activations instead of gathering rows by route. ``pre_scale``: dequantize before
    the dot (TensorRT-LLM's numerics) rather than scale each K-tile's partial sum.
    ``asm``: PRMT through inline PTX (the GPU; the interpreter cannot run PTX).
    ``scale_pairs``: read scales as 32-bit pairs (pipelined copies) rather than 16-bit.
    ``split_tail`` (scheduled): an expert's last M-tile of at most ``bm / 2`` routes runs
    at half width."""

    bm: int
    bn: int
    bk: int
    num_warps: int = 4
    num_stages: int = 3
    scheduled: bool = False
    persistent: int = 1
    x_sorted: bool = False
    pre_scale: bool = True
    asm: bool = True
    scale_pairs: bool = True
    split_tail: bool = False

    def describe(self) -> str:
        mode = "scheduled" if self.scheduled else "in-kernel routes"
        extra = [f"{self.persistent}/SM" if self.scheduled and self.persistent else "",
                 "x sorted" if self.x_sorted else "", "post-scale" if not self.pre_scale else "",
                 "no asm" if not self.asm else "", "16-bit scales" if not self.scale_pairs else "",
                 "split tail" if self.split_tail else ""]
        return (f"{self.bm}x{self.bn}x{self.bk} w{self.num_warps} s{self.num_stages} {mode}"
                + "".join(f", {e}" for e in extra if e))


def _pow2(v: int) -> bool:
    return v >= 16 and not v & (v - 1)


def check_tile(tile: MoETile, routes: int, k: int, group: int, gated: bool = False) -> None:
    """Refuse a tile the kernel cannot run, naming the rule."""
    problems = []
    if tile.bk % CHUNK or group % tile.bk or k % tile.bk:
        problems.append(f"bk={tile.bk} must be a multiple of {CHUNK} dividing group_size={group} and K={k}")
    if not all(_pow2(v) for v in (tile.bm, tile.bn, tile.bk)):
        problems.append("bm, bn, bk must be powers of two >= 16 (tl.arange, tl.dot)")
    if not tile.scheduled and routes > SMALL_MAX_ROUTES:
        problems.append(f"in-kernel routing takes at most {SMALL_MAX_ROUTES} routes, the call has {routes}")
    if tile.x_sorted and not tile.scheduled:
        problems.append("x_sorted needs the scheduled kernel")
    if tile.split_tail and (not tile.scheduled or tile.bm < 32):
        problems.append(f"split_tail halves a scheduled M-tile: scheduled with bm >= 32, got {tile}")
    if gated and tile.bn < 32:
        problems.append(f"a gated tile pairs 16-row blocks: bn >= 32, got {tile.bn}")
    if problems:
        raise KernelInputError(f"tile {tile}: " + "; ".join(problems))


#: (largest routes per expert, tile) in increasing order, per device name. The H100's is
#: the tuned table of the last sweep (benchmarks/results/trtllm_moe-NVIDIA-H100-80GB-HBM3.json,
#: ``tuned_table``; every tile tried is in its ``rows``), except its last row: the sweep's
#: fastest there was the persistent 256-row tile, 3.673 ms against 3.699 ms for this
#: one-program-per-tile split-tail tile in the same run (0.7 %, inside the spread), and
#: this one is what the CUDA conformance run and the correctness matrix covered (below).
_H100 = (
    (1, MoETile(16, 64, 128, 4, 4, pre_scale=False)),
    (8, MoETile(16, 64, 128, 4, 4)),
    (24, MoETile(32, 128, 128, 4, 4)),
    (192, MoETile(256, 128, 64, 8, 4, scheduled=True, persistent=0, split_tail=True)),
    (1 << 62, MoETile(256, 128, 64, 8, 4, scheduled=True, persistent=0, split_tail=True)),
)
TABLES = {"NVIDIA H100 80GB HBM3": _H100}
#: A JSON file ``{"table": [[limit, {MoETile fields}], ...]}`` that replaces the shipped
#: table (what ``tools/probes/trtllm_moe_tiles.py`` writes for the device it ran on).
ENV_TABLE = "QUANTCORE_TRTLLM_MOE_TILES"
#: What the H100 computed wrong, on inputs the interpreter computes right (cause not
#: established; the sweep JSON's ``wide_tile_matrix``): the persistent 256-row tile with
#: fp16 scales, three cases of three (groups of 64 and 128, 16- and 32-bit scale loads),
#: rel. errors 0.1 to 111; the one-program-per-tile 256-row tile was right for fp16 and
#: bf16, groups of 64 and 128. The kernel before this one also failed at 256 rows with
#: groups of 64. So: persistent programs only with bf16 scales, and 256-row tiles only
#: where the conformance run put them (bf16 scales, groups of 128); elsewhere ``NARROW``.
NARROW = MoETile(128, 128, 128, 8, 4, scheduled=True, persistent=0, split_tail=True)


def tile_table(device_name: str | None) -> tuple[tuple[int, MoETile], ...]:
    path = os.environ.get(ENV_TABLE)
    if path:
        data = read_json(path, error=InvalidArgumentError)
        try:
            return tuple((int(limit), MoETile(**spec)) for limit, spec in data["table"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"{ENV_TABLE}={path}: expected {{'table': [[routes, tile], ...]}} "
                                       f"({type(exc).__name__}: {exc})") from None
    return TABLES.get(device_name or "", _H100)


def pick_tile(
    routes: int, experts: int, k: int, group: int, *, scale_dtype: torch.dtype | None = None,
    device_name: str | None = None, interpreted: bool = False,
) -> MoETile:
    """The shipped tile for a call of ``routes`` routes over ``experts`` experts."""
    bk_max = 128 if group % 128 == 0 and k % 128 == 0 else 64
    if interpreted:  # few programs: the interpreter pays mostly per program
        if routes <= SMALL_MAX_ROUTES:
            return MoETile(32, 64, 64, asm=False)
        return MoETile(128, 64, 64, scheduled=True, persistent=0, asm=False)
    per_expert = routes / max(1, experts)
    tile = next(t for limit, t in tile_table(device_name) if per_expert <= limit)
    if not tile.scheduled and routes > SMALL_MAX_ROUTES:
        tile = replace(tile, scheduled=True)
    bf16 = scale_dtype in (None, torch.bfloat16)
    if tile.bm > 128 and not (bf16 and group >= 128):
        tile = NARROW
    if tile.scheduled and tile.persistent and not bf16:
        tile = replace(tile, persistent=0)
    return replace(tile, bk=min(tile.bk, bk_max))
