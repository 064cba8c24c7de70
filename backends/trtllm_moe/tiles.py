"""Launch shapes of the Triton MoE kernel: what a tile is, the rules it must keep, and
the shipped choice per card (no autotuning on a user's first call).

The choice depends on everything that changes the kernel's geometry: the routes per
expert the call can expect (``R / E``: M per expert), N, K and the group size (a K-tile
lies inside one group and divides K), symmetric or not, the scales' dtype, and the card
(its :class:`~quantcore.probe.card.CardKey`: a card without a table takes the nearest
of its architecture, :mod:`quantcore.probe.card_tables`). The compiled kernel is further
specialised by Triton on every constexpr (K, group, tile, dtype, variant flags), so a
new shape compiles once and never reuses another's binary.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from quantcore.errors import InvalidArgumentError, KernelInputError
from quantcore.files import read_json
from quantcore.probe.card import CardKey
from quantcore.probe.card_tables import H100_SXM, table_for

__all__ = [
    "CHUNK", "ENV_TABLE", "NARROW", "ONE_LAUNCH_MAX_ROUTES", "SCAN_LOG", "SMALL_MAX_ROUTES", "MoETile", "check_tile",
    "pick_tile", "pow2_at_least", "route_bound", "tile_table", "uses_wgmma",
]

CHUNK = 64  # K rows per interleaved column tile of the layout
#: Up to this many routes the kernel finds each expert's routes itself (one launch);
#: more are sorted by a scheduling kernel first.
SMALL_MAX_ROUTES = 128
#: A scheduled program without the scheduling kernel reads the expert ids ``2**SCAN_LOG``
#: at a time (README.md here, "Routes": what that costs a program).
SCAN_LOG = 10
#: Up to this many routes a scheduled call is one launch (each program finds its tile's
#: routes in the ids); above, the scheduling kernel sorts them first, where the per-program
#: scan of all the ids would grow past a few per cent of a tile's work (README.md here,
#: "Routes"). A power of two: the launcher's buckets change there too.
ONE_LAUNCH_MAX_ROUTES = 2048


@dataclass(frozen=True)
class MoETile:
    """``bm`` routes × ``bn`` weight columns per tile, ``bk`` K rows per step.

    ``scheduled``: a tile scheduler over (expert, M-tile, N-tile) with ``persistent``
    programs per SM (0: one program per tile) — prefill; otherwise each program finds
    its expert's routes in the kernel — decode. A scheduled program derives its tile's
    expert and routes from the ids itself (one launch), or with ``schedule_kernel`` reads
    them from a scheduling kernel launched first. ``x_sorted``: read a permuted copy of
    the activations instead of gathering rows by route (written by the scheduling kernel:
    implies it). ``pre_scale``: dequantize before the dot (TensorRT-LLM's numerics)
    rather than scale each K-tile's partial sum.
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
    schedule_kernel: bool = False

    @property
    def two_launches(self) -> bool:
        """A scheduled tile whose routes a scheduling kernel sorts before the GEMM."""
        return self.scheduled and (self.schedule_kernel or self.x_sorted)

    def describe(self) -> str:
        mode = "scheduled" if self.scheduled else "in-kernel routes"
        extra = [f"{self.persistent}/SM" if self.scheduled and self.persistent else "",
                 "x sorted" if self.x_sorted else "", "post-scale" if not self.pre_scale else "",
                 "no asm" if not self.asm else "", "16-bit scales" if not self.scale_pairs else "",
                 "split tail" if self.split_tail else "", "schedule kernel" if self.two_launches else ""]
        return (f"{self.bm}x{self.bn}x{self.bk} w{self.num_warps} s{self.num_stages} {mode}"
                + "".join(f", {e}" for e in extra if e))


def pow2_at_least(v: int, low: int) -> int:
    """The power of two at or above ``v``, at least ``low`` (the kernels' route bounds)."""
    return max(low, 1 << max(0, (v - 1).bit_length()))


def route_bound(tile: MoETile, routes: int) -> int:
    """The GEMM's compile-time route bound ``R_PAD`` for a call of ``routes`` routes:
    in-kernel routing reads all of them at once (a power of two >= 16 at or above them);
    the scheduled kernel does not use it (16)."""
    return 16 if tile.scheduled else pow2_at_least(routes, 16)


def _pow2(v: int) -> bool:
    return v >= 16 and not v & (v - 1)


def uses_wgmma(card: CardKey | None) -> bool:
    """Whether Triton compiles the kernel's dots to Hopper's asynchronous wgmma there."""
    return card is not None and card.arch == "sm_90"


def check_tile(tile: MoETile, routes: int, k: int, group: int, gated: bool = False, *,
               scale_dtype: torch.dtype | None = None, wgmma: bool = False) -> None:
    """Refuse a tile the kernel cannot run, naming the rule. ``wgmma``: the call runs the
    compiled kernel on sm_90 (:func:`uses_wgmma`)."""
    problems = []
    if tile.bk % CHUNK or group % tile.bk or k % tile.bk:
        problems.append(f"bk={tile.bk} must be a multiple of {CHUNK} dividing group_size={group} and K={k}")
    if not all(_pow2(v) for v in (tile.bm, tile.bn, tile.bk)):
        problems.append("bm, bn, bk must be powers of two >= 16 (tl.arange, tl.dot)")
    if not tile.scheduled and routes > SMALL_MAX_ROUTES:
        problems.append(f"in-kernel routing takes at most {SMALL_MAX_ROUTES} routes, the call has {routes}")
    if tile.x_sorted and not tile.scheduled:
        problems.append("x_sorted needs the scheduled kernel")
    if tile.schedule_kernel and not tile.scheduled:
        problems.append("schedule_kernel sorts the routes of a scheduled tile: scheduled=True")
    if tile.split_tail and (not tile.scheduled or tile.bm < 32):
        problems.append(f"split_tail halves a scheduled M-tile: scheduled with bm >= 32, got {tile}")
    if gated and tile.bn < 32:
        problems.append(f"a gated tile pairs 16-row blocks: bn >= 32, got {tile.bn}")
    if wgmma and tile.pre_scale and scale_dtype not in (None, torch.bfloat16):
        problems.append(
            f"pre_scale with {scale_dtype} scales on sm_90: the pipelined wgmmas read the dequantized weights from "
            "registers that the compiled code rewrites for the next K-step while they are still in flight (wrong "
            "results; README.md here, 'the 256-row fp16 tile'): use pre_scale=False")
    if problems:
        raise KernelInputError(f"tile {tile}: " + "; ".join(problems))


#: (largest routes per expert, tile) in increasing order, per card. The H100's is the
#: tuned table of the last sweep (benchmarks/results/trtllm_moe-NVIDIA-H100-80GB-HBM3.json,
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
TABLES = {H100_SXM: _H100}
#: What a card of an architecture without a table runs: the H100's table, its tiles being
#: valid on every SM >= 8.0 GPU. The H200's own sweep picked the same tile at every T
#: (benchmarks/results/probes/trtllm_moe-sweep-nvidia-h200.json), so it runs this one too.
RULE = _H100
#: A JSON file ``{"table": [[limit, {MoETile fields}], ...]}`` that replaces the shipped
#: table (what ``tools/probes/trtllm_moe_tiles.py`` writes for the card it ran on).
ENV_TABLE = "QUANTCORE_TRTLLM_MOE_TILES"
#: The 128-row tile that serves where the 256-row one has not been checked. On the H100
#: the persistent 256-row tile computed wrong results with fp16 scales (the sweep JSON's
#: ``wide_tile_matrix``: three cases of three, rel. errors 0.1 to 111); the cause is the
#: register-operand wgmma hazard that :func:`check_tile` refuses (every pre-scaled fp16
#: tile has it in its sm_90 code; README.md here). Post-scaled, every fp16 tile is right
#: (H200, E = 8, top-2, 4096 × 28672, T = 4096: 0 hazards, 5 of 5 calls within 2.1e-4 of
#: the float reference), but the 256-row ones take 14–16 ms against this tile's 5.5–6.3
#: (``benchmarks/results/probes/trtllm_moe_wgmma_hazard-nvidia-h200.json``): 256-row
#: tiles stay with bf16 scales in groups of 128, persistent programs with bf16 scales, and
#: elsewhere ``NARROW``.
NARROW = MoETile(128, 128, 128, 8, 4, scheduled=True, persistent=0, split_tail=True)


def tile_table(card: CardKey | None) -> tuple[tuple[int, MoETile], ...]:
    path = os.environ.get(ENV_TABLE)
    if path:
        data = read_json(path, error=InvalidArgumentError)
        try:
            return tuple((int(limit), MoETile(**spec)) for limit, spec in data["table"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"{ENV_TABLE}={path}: expected {{'table': [[routes, tile], ...]}} "
                                       f"({type(exc).__name__}: {exc})") from None
    return table_for(TABLES, card) or RULE


def pick_tile(
    routes: int, experts: int, k: int, group: int, *, scale_dtype: torch.dtype | None = None,
    card: CardKey | None = None, interpreted: bool = False,
) -> MoETile:
    """The shipped tile for a call of ``routes`` routes over ``experts`` experts on
    ``card`` (None: the rule, as on a card of an architecture without a table)."""
    bk_max = 128 if group % 128 == 0 and k % 128 == 0 else 64
    if interpreted:  # few programs: the interpreter pays mostly per program
        if routes <= SMALL_MAX_ROUTES:
            return MoETile(32, 64, 64, asm=False)
        return MoETile(128, 64, 64, scheduled=True, persistent=0, asm=False,
                       schedule_kernel=routes > ONE_LAUNCH_MAX_ROUTES)
    per_expert = routes / max(1, experts)
    tile = next(t for limit, t in tile_table(card) if per_expert <= limit)
    if not tile.scheduled and routes > SMALL_MAX_ROUTES:
        tile = replace(tile, scheduled=True)
    bf16 = scale_dtype in (None, torch.bfloat16)
    if tile.bm > 128 and not (bf16 and group >= 128):
        tile = NARROW
    if tile.scheduled and tile.persistent and not bf16:
        tile = replace(tile, persistent=0)
    if not bf16 and uses_wgmma(card):
        tile = replace(tile, pre_scale=False)  # what check_tile requires there
    if tile.scheduled and routes > ONE_LAUNCH_MAX_ROUTES:
        tile = replace(tile, schedule_kernel=True)
    return replace(tile, bk=min(tile.bk, bk_max))
