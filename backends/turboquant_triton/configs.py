"""Launch configurations of the TurboQuant Triton kernels: the shipped tables (tuned by
``tools/probes/turboquant_tune.py``, so a first call needs no autotuning) and the rule
used where no table entry fits.

Tables are keyed by the card's features (:class:`~quantcore.probe.card.CardKey`:
architecture, SMs, shared memory per block, bandwidth class), never by a device name: a
card without a table of its own takes the nearest table of its architecture
(:mod:`quantcore.probe.card_tables`) — an H200 runs the H100's configurations, not the
rule's — and a card of another architecture takes the rule.

Within a card's table an entry is looked up by everything that changes the kernel's
geometry — kernel, K, N, group size, number of passes, activation dtype, and for the
tensor-core kernel the M bucket — so a config tuned for one layer is never applied to a
layer whose groups or passes differ (a past bug: a group-64 tile reused for group 32 ran
no step and returned zeros). fp16 and bf16 have one geometry: a layer tuned in one takes
that entry in the other where the other has none of its own.

Tables: every ``tuned-<card slug>.json`` beside this file, then the file named by the
environment variable ``QUANTCORE_TURBOQUANT_CONFIGS`` (its entries win over the shipped
ones of the same card). Each is ``{"card": {...}, "entries": [{"kernel": "gemv" | "mma" |
"mma_decode" | "paths", "K", "N", "d", "passes", "dtype", ["m_bucket" | "m"], "config": {...}},
...]}``. An ``mma_decode`` entry serves only the card whose table holds it (never the nearest
one), at ``m`` = 1 for one row and ``m`` = 8 for 2 … 8 rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from quantcore.errors import InvalidArgumentError
from quantcore.probe.card import CardKey
from quantcore.probe.card_tables import read_card_json, table_for

__all__ = [
    "EAGER_ONCE_MAX_MACS",
    "GEMV_VARIANTS",
    "MMA_DECODE_ROWS",
    "ROTATION_MAX_BLOCK_M",
    "ROTATION_MAX_GROUP",
    "GemvConfig",
    "MmaConfig",
    "MmaDecodeConfig",
    "PathChoice",
    "gemv_config",
    "gemv_rotation_bytes",
    "m_bucket",
    "mma_config",
    "mma_decode_config",
    "mma_entry",
    "mma_rotation",
    "mma_rule",
    "path_for",
    "rotate_in_kernel",
    "table",
    "tables",
]

ENV = "QUANTCORE_TURBOQUANT_CONFIGS"
#: ``outside``, ``kernel`` or ``once``: where the tensor-core kernel applies a shared 16-bit
#: input rotation (:func:`mma_rotation`), for every bucket made while it is set, whatever
#: the config says (to time them on one device); a rotation per group or in float32 is
#: always applied outside.
ROTATION_ENV = "QUANTCORE_TURBOQUANT_MMA_ROTATION"
#: The values of :data:`ROTATION_ENV`.
MMA_ROTATIONS = ("outside", "kernel", "once")


#: The decode kernel's codebook lookups (``GemvConfig.lookup``), in ``pairs.py``'s order.
LOOKUPS = ("single", "pairs", "half_pairs")
#: The paired lookups' static table (``pairs.py``): 256 byte values, 32 KB with its copies.
PAIRS_TABLE_BYTES = 32 * 1024


def gemv_rotation_bytes(d: int, dot_fp32: bool, lookup: str) -> int:
    """Shared memory of a decode program that rotates x itself: Π [d, d] and x's row
    padded to the dot's 16 rows [16, d], in the dot's dtype, and the paired lookups' table.
    Compiled for sm_90 (one or two passes alike): 36,864 B at d = 128 in bf16, 73,728 in
    float32, 139,264 at d = 256 in bf16, 278,528 in float32 — over any GPU's 227 KB."""
    return (d * d + 16 * d) * (4 if dot_fp32 else 2) + (PAIRS_TABLE_BYTES if lookup != "single" else 0)


@dataclass(frozen=True)
class GemvConfig:
    """Decode kernel: ``gpc`` groups per program, about ``ctas`` programs, ``br`` rows a
    step, the row loop unrolled ``unroll`` times (3 = the prefetch depth: no moves),
    ``maxnreg``, a cap on registers per thread (None: the compiler's choice) — the
    kernel is latency-bound, so a cap that lets more programs share an SM keeps more
    index words in flight (same code and arithmetic, other register allocation) — and
    ``prerotate``."""

    gpc: int = 8
    ctas: int = 396
    br: int = 8  # rows × 128 words = 4 words (one 16-byte vector) per thread at 8 warps
    warps: int = 8
    unroll: int = 3
    maxnreg: int | None = None
    #: a shared rotation applied once per call by a small kernel (gemv.rotate_kernel)
    #: rather than by every program: no d² rotation read and no dot per program, one
    #: launch more (the same float32 rows, bit for bit)
    prerotate: bool = False
    #: the codebook lookup (pairs.py): ``single`` (one index a shared-memory load),
    #: ``pairs`` (both indices of a byte in one 8-byte load, the same float32 centroids:
    #: the same output, bit for bit) or ``half_pairs`` (both in one 4-byte load of fp16
    #: centroids: half the shared-memory bytes; a codebook outside fp16's normal range takes
    #: ``pairs``). A pair table needs at least 4 warps to fill.
    lookup: str = "single"
    #: programmatic dependent launch (sm_90+): the launch may start while the kernel before
    #: it finishes; its programs read the index words, scales, rotation and codebook first
    #: and wait for that kernel before they read x or write anything (gemv.py)
    pdl: bool = False
    #: each thread's two 16-byte vectors of index words from the two halves of a row, so a
    #: warp-wide load reads whole 32-byte sectors where the compiler gives a thread 8
    #: consecutive words (gemv._word_columns); tiles of fewer than 8 columns ignore it
    halves: bool = False

    def __post_init__(self) -> None:
        if self.lookup not in LOOKUPS:
            raise ValueError(f"GemvConfig: lookup expected one of {LOOKUPS}, got {self.lookup!r}")
        if self.lookup != "single" and self.warps < 4:
            raise ValueError(f"GemvConfig: lookup={self.lookup!r} fills its table with at least 4 warps, "
                             f"got warps={self.warps}")


@dataclass(frozen=True)
class MmaConfig:
    """Tensor-core kernel: a [block_n, block_m] output tile, ``gpc`` groups per program;
    ``rotate_in_kernel``: each program rotates its x columns itself (one launch a call;
    None counts as True) or, False, x is rotated once per call by a GEMM before the launch
    (two); ``rotate_once``: x rotated once per call by rotation programs of the same
    launch (one launch; wins over ``rotate_in_kernel``) — :func:`mma_rotation` has the
    last word; ``register_operand``: the weight operand made in the matrix unit's register
    layout, x rotated into its coordinate order (``operand.py``; d ≥ 64 and 16-bit
    operands, else through shared memory as by default); ``scaled_operand``: with the
    register operand only (ignored wherever that is not used), the group's per-row scale
    applied to the operand before the dot and the dot accumulating into the output tile,
    so that no per-group multiply of its result makes the kernel wait for its MMAs.

    ``scaled_operand``'s arithmetic: per weight ŵ = rn(c · s), c the float32 centroid, s
    the float32 (row, group) scale, c · s rounded to float32 and then once to x's dtype
    (bf16 or fp16) to nearest even; the output is Σ_groups Σ_k ŵ · x_rot[k] with float32
    accumulation in the matrix unit. Without it: rn(c) in x's dtype, the group's dot in
    float32, times s in float32, added to the tile. Either rounds each weight once to x's
    dtype (a relative error of at most 2⁻⁹ in bf16, 2⁻¹² in fp16, plus fp16's absolute
    2⁻²⁵ below its normal range); they differ in what is rounded, so the outputs are not
    bit-identical in general (they are when every c · s is exact in x's dtype)."""

    block_n: int = 64
    block_m: int = 16
    gpc: int = 4
    warps: int = 4
    stages: int = 3
    ctas: int = 264
    rotate_in_kernel: bool | None = None
    rotate_once: bool = False
    register_operand: bool = False
    scaled_operand: bool = False


#: The most activation rows the ``mma.sync`` decode kernel multiplies (the MMA's N).
MMA_DECODE_ROWS = 8


@dataclass(frozen=True)
class MmaDecodeConfig:
    """The ``mma.sync`` decode kernel (``decode_mma.py``, M ≤ :data:`MMA_DECODE_ROWS`):
    ``split`` programs share a row tile's K (every pass's groups, one GEMV of depth P·K),
    ``tiles`` 64-row tiles a program (they share the program's pair table and staged x),
    ``copies`` of each pair-table entry in shared memory (32: every lane its own bank);
    ``wide``: a step reads two groups of a pass (each row's whole 128-byte line); ``xvec``: x
    staged with 16-byte loads."""

    split: int = 8
    tiles: int = 2
    copies: int = 32
    wide: bool = False
    xvec: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.split, int) and self.split >= 1 and self.tiles in (1, 2) and self.copies in (16, 32)):
            raise ValueError(f"MmaDecodeConfig: expected split >= 1, tiles 1 or 2, copies 16 or 32, got {self}")


@dataclass(frozen=True)
class FoldConfig:
    """The fold kernel (``fold.py``): ``block_n`` rows of ``groups`` consecutive groups a
    program (at most: the largest power of two up to it that divides the group count; a
    shared rotation is read from L2 once per program, not per group), ``warps``,
    ``stages`` of software pipelining over the groups (1: none), a register cap
    (``maxnreg``, None: the compiler's), and ``register_operand``: Ŵ made in the matrix
    unit's register layout (``operand.py``; d ≥ 64 and 16-bit operands, else through
    shared memory). 128 rows on 8 warps through shared memory take 64 KB; 64 rows would
    take exactly 48 KB, which cannot launch beside the codebook's static table
    (``lookup.py``)."""

    block_n: int = 128
    warps: int = 8
    groups: int = 1
    stages: int = 1
    maxnreg: int | None = None
    register_operand: bool = False
    #: programs per SM of a persistent launch over all tiles (``groups`` then unused); 0: a
    #: program per row block and ``groups`` groups
    persistent: int = 0


#: The fold for d ≤ 128: one warpgroup on 64 rows, the register operand, persistent programs
#: walking every tile, pipelined three deep; one pass four programs an SM (a 128-register
#: cap), two passes two (their operands take 89 KB of shared memory). H200,
#: ``tools/probes/turboquant_prefill_parts.py`` (benchmarks/results/probes/
#: turboquant_prefill_parts-*.json), 4096 × 14336: one pass 116 → 66 µs, two passes 204 →
#: 109 µs, against 128 rows through shared memory and one group a program; a program per
#: row block and 8 groups left a partial last wave (82–97 and 129–131 µs). Wider groups keep
#: the 128-row shared-memory kernel: a [64, 256] register operand and its [64, 256]
#: accumulator do not fit one warpgroup's registers.
FOLD_NARROW = FoldConfig(block_n=64, warps=4, stages=3, maxnreg=128, persistent=4, register_operand=True)
FOLD_NARROW_TWO_PASSES = FoldConfig(block_n=64, warps=4, stages=3, persistent=2, register_operand=True)


#: The widest group the fold path takes by default. Wider, the kernel keeps [d, d] rotations
#: and [128, d] operands in shared memory: 192 KB at d = 256 with one pass, 320 KB (more
#: than an SM has) with two.
FOLD_MAX_GROUP = 128


def fold_config(d: int, passes: int) -> FoldConfig:
    """The fold kernel's launch for groups of ``d`` columns and ``passes`` passes."""
    if d > FOLD_MAX_GROUP:
        return FoldConfig()
    return FOLD_NARROW_TWO_PASSES if passes == 2 else FOLD_NARROW


@dataclass(frozen=True)
class PathChoice:
    """Largest M for the decode kernel, and largest M for the fused tensor-core kernel;
    above it a dense weight in a scratch and cuBLAS: every pass dequantized (``dequant.py``),
    or from ``fold_from_m`` (per pass count) the rotations folded into it (``fold.py``).

    The fold thresholds were measured on an H200 (``tools/probes/turboquant_paths.py --part
    fold`` and ``--part fold_mid``, benchmarks/results/probes/turboquant_paths-fold*-*.json):
    with two passes the fold halves the GEMM and wins from M = 256 on every shape (1.1–1.4×
    at M = 256, 1.7–2.0× from M = 2048); with one pass it trades the input's rotation
    (M·K) for the weight's (N·K·d) and wins only at M = 8192 (up to 7 %), losing up to 18 %
    at M = 512–2048."""

    gemv_max_m: int = 1
    mma_max_m: int = 256
    fold_from_m_one_pass: int = 8192
    fold_from_m_two_passes: int = 256

    def prefill_path(self, m: int, passes: int, d: int) -> str:
        """``"fold"`` or ``"dequant"`` for a call of ``m`` rows above ``mma_max_m`` (groups
        of ``d`` columns: wider than :data:`FOLD_MAX_GROUP`, always ``"dequant"``)."""
        start = self.fold_from_m_two_passes if passes == 2 else self.fold_from_m_one_pass
        return "fold" if m >= start and d <= FOLD_MAX_GROUP else "dequant"


#: Decode variants for a GPU sweep to time beside the shipped configurations (not used
#: unless a table names them): the shipped 4096 × 14336 one-pass geometry with the
#: rotation once per call — on sm_90 (tools/compile_report): 101 instead of 128
#: registers, 2 KB instead of 36 KB of shared memory, no dot and no 32 KB rotation read
#: per program — and with a cap of 80 registers, which then spills nothing and lets three
#: programs share an SM instead of two (5.3 instead of 4.8 instructions a weight in the
#: row loop: the sweep decides); the default and the two-pass geometry rotated once.
GEMV_VARIANTS = (
    GemvConfig(gpc=8, ctas=264, br=16, warps=8, unroll=1, prerotate=True),
    GemvConfig(gpc=8, ctas=264, br=16, warps=8, unroll=1, maxnreg=80, prerotate=True),
    GemvConfig(gpc=8, ctas=396, br=8, warps=8, unroll=3, prerotate=True),
    GemvConfig(gpc=8, ctas=264, br=8, warps=8, unroll=1, prerotate=True),
    # The two-pass plans' 8-row tiles with the index words in two halves of a row, which made
    # them 9–20 % faster on the H200 (README: "Index words in two halves of a row").
    GemvConfig(gpc=8, ctas=264, br=8, warps=8, unroll=1, halves=True),
    GemvConfig(gpc=8, ctas=396, br=8, warps=8, unroll=1, halves=True),
)

_KINDS = {"gemv": GemvConfig, "mma": MmaConfig, "mma_decode": MmaDecodeConfig, "paths": PathChoice}


def _dtype_name(dtype: object) -> str:
    return str(dtype).replace("torch.", "")


def _key(entry: dict[str, Any]) -> tuple[Any, ...]:
    kind = entry["kernel"]
    if kind == "paths":
        return ("paths",)
    key = (kind, entry["K"], entry["N"], entry["d"], entry["passes"], entry["dtype"])
    if kind == "mma":
        return (*key, entry["m_bucket"])
    return (*key, entry["m"]) if kind == "mma_decode" else key


Table = dict[tuple[Any, ...], Any]


def _load(path: Path) -> tuple[CardKey, Table]:
    card, data = read_card_json(path)
    out: Table = {}
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise InvalidArgumentError(f"{path}: expected \"entries\": a list of tuned configs, got {type(entries).__name__}")
    for entry in entries:
        try:
            cls = _KINDS[entry["kernel"]]
            names = {f.name for f in fields(cls)}
            out[_key(entry)] = cls(**{k: v for k, v in entry["config"].items() if k in names})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidArgumentError(f"{path}: an entry is not a tuned config ({type(exc).__name__}: "
                                       f"{exc}): {str(entry)[:80]}") from None
    return card, out


@lru_cache(maxsize=4)
def _tables(extra: str | None) -> dict[CardKey, Table]:
    merged: dict[CardKey, Table] = {}
    paths = sorted(Path(__file__).parent.glob("tuned-*.json")) + ([Path(extra)] if extra else [])
    for path in paths:
        card, entries = _load(path)
        merged.setdefault(card, {}).update(entries)
    return merged


def tables() -> dict[CardKey, Table]:
    """The shipped tables plus the environment's file, per card."""
    return _tables(os.environ.get(ENV) or None)


def table(card: CardKey | None) -> Table:
    """The entries that serve ``card`` (its own table or the nearest of its
    architecture); empty for no card (the CPU, the interpreter) or no such table."""
    return table_for(tables(), card) or {}


#: A 16-bit activation dtype's twin: the kernels' geometry (bytes moved, registers, shared
#: memory) is the same for both, only the conversions differ, so a layer tuned in one dtype
#: takes that entry in the other rather than the rule (on an H200 the rule's decode plan
#: took 14.6 µs at 4096 × 4096 in fp16 against the bf16 entry's 9.5 µs).
_SAME_WIDTH = {"bfloat16": "float16", "float16": "bfloat16"}


def _entry(card: CardKey | None, kind: str, k: int, n: int, d: int, passes: int, dtype: object,
           *bucket: int) -> Any:
    """The card's entry for this layer in ``dtype``, else in its 16-bit twin, else None."""
    entries, name = table(card), _dtype_name(dtype)
    hit = entries.get((kind, k, n, d, passes, name, *bucket))
    twin = _SAME_WIDTH.get(name)
    if hit is None and twin is not None:
        hit = entries.get((kind, k, n, d, passes, twin, *bucket))
    return hit


def gemv_config(card: CardKey | None, k: int, n: int, d: int, passes: int, dtype: object) -> GemvConfig:
    hit = _entry(card, "gemv", k, n, d, passes, dtype)
    if isinstance(hit, GemvConfig):
        return hit
    groups = k // d
    # 128 index words (512 bytes) of a row per program and pass: 32 lanes × one 16-byte vector.
    gpc = max(1, min(16, 1024 // d, 1 << (groups.bit_length() - 1)))
    if passes == 2:  # twice the registers: 2 programs an SM, no unrolling
        return GemvConfig(gpc=gpc, ctas=264, unroll=1)
    return GemvConfig(gpc=gpc)


def mma_decode_config(card: CardKey | None, m: int, k: int, n: int, d: int, passes: int,
                      dtype: object) -> MmaDecodeConfig | None:
    """The ``mma.sync`` decode kernel's config where the card's OWN table names it for this
    layer (entry ``m`` = 1 for one row, 8 for 2 … 8), else None: where it beats the other
    paths depends on the card and the shape (it lost at one pass and M = 1 on 4096-wide
    layers of an H200), so no other card's or shape's entry stands in."""
    if card is None or not 1 <= m <= MMA_DECODE_ROWS:
        return None
    own = tables().get(card, {})
    name = _dtype_name(dtype)
    rows = 1 if m == 1 else MMA_DECODE_ROWS
    hit = own.get(("mma_decode", k, n, d, passes, name, rows))
    if hit is None and name in _SAME_WIDTH:
        hit = own.get(("mma_decode", k, n, d, passes, _SAME_WIDTH[name], rows))
    return hit if isinstance(hit, MmaDecodeConfig) else None


def m_bucket(m: int) -> int:
    """The M part of a tensor-core key: the next power of two (16 at least), capped."""
    return min(max(16, 1 << max(m - 1, 0).bit_length()), 4096)


def mma_entry(card: CardKey | None, m: int, k: int, n: int, d: int, passes: int, dtype: object) -> MmaConfig | None:
    """The card's table entry for this layer and M bucket, if any."""
    hit = _entry(card, "mma", k, n, d, passes, dtype, m_bucket(m))
    return hit if isinstance(hit, MmaConfig) else None


def mma_rule(m: int, in_kernel: bool) -> MmaConfig:
    """The tensor-core tile where no table entry fits, for x rotated in the kernel or
    outside it — or once, by the launch's rotation programs, whose group loop is the
    outside variant's (shared-memory sizes and registers: ``python -m tools.compile_report``)."""
    if m <= 16:
        return MmaConfig(block_n=64, block_m=16)
    if m <= 32:
        # Dynamic shared memory of exactly 48 KB cannot launch beside the 1 KB codebook
        # table (lookup.py): outside, 3 stages hit it at d = 128; inside, 3, 4 and 5
        # stages each hit it with one of d = 64's pass layouts, 2 with none.
        return MmaConfig(block_n=64, block_m=32, stages=2 if in_kernel else 4)
    if in_kernel:
        # The rotation's [d, 64] float32 result beside the output tile: at 4 warps two
        # passes spill (255 registers) and one pass holds 239; 8 warps hold 118-127 and 2
        # stages keep two programs an SM (100-136 KB shared at d = 128).
        return MmaConfig(block_n=64, block_m=64, warps=8, stages=2)
    return MmaConfig(block_n=64, block_m=64)  # beat 128-row tiles at M = 128 on the H100


def mma_config(card: CardKey | None, m: int, k: int, n: int, d: int, passes: int, dtype: object, *,
               rotation_per_group: bool = False, fp32_operands: bool = False, wide_group: bool = False) -> MmaConfig:
    """The table's entry, else the rule's tile for where the rotation runs by default."""
    hit = mma_entry(card, m, k, n, d, passes, dtype)
    if hit is not None:
        return hit
    inside = rotate_in_kernel(MmaConfig(), rotation_per_group=rotation_per_group, fp32_operands=fp32_operands,
                              wide_group=wide_group)
    rule = mma_rule(m, inside)
    # The register operand beat the shared-memory one on an H100 at every shape and M timed
    # (README.md, "The register operand"), the rule's tiles at M = 32 and 64 included;
    # elsewhere it is not yet measured, so it stays off.
    return replace(rule, register_operand=True) if card is not None and card.arch == "sm_90" else rule


#: The widest group whose rotation the tensor-core kernel applies inside its launch (the
#: group size every measurement of the in-kernel and once rotations used).
ROTATION_MAX_GROUP = 128


#: An eager call's largest tensor-core work (M·N·K multiply-adds, M at the top of its bucket)
#: for which x is rotated inside the launch (``once``) rather than by a GEMM before it. Over
#: a launch, the GEMM and its torch ops cost the host about as much as a whole nn.Linear call,
#: while ``once`` costs the GPU its wait for the last rotation chunk: on an H100 (README.md,
#: "Rotation once per call") 3–7 µs at 4096×4096 and 3–4 µs at 4096×14336, against 15–18 µs
#: of host time saved. Up to this much work an eager call waits on its host or nearly (the
#: outside variant takes 17–53 µs on the GPU, ~40 µs on the host), so one launch is faster;
#: above it (4096×14336 at M = 128: 65–88 µs on the GPU) the GPU bounds the call and the
#: faster GEMM plan stays.
EAGER_ONCE_MAX_MACS = 1 << 32


#: The widest tile (rows of x) that rotates x inside its launch (``kernel`` or ``once``).
#: Compiled for sm_90, the 64 × 128 register-operand tile holds 237 registers with x rotated
#: outside and spills 144 bytes (``kernel``) or 552 (``once``) with the rotation's float32
#: result beside its output tile (``python -m tools.compile_report turboquant_triton``).
ROTATION_MAX_BLOCK_M = 64


def mma_rotation(cfg: MmaConfig, *, rotation_per_group: bool = False, fp32_operands: bool = False,
                 wide_group: bool = False, eager_macs: int | None = None) -> str:
    """Where the tensor-core kernel gets x rotated (``mma.py``): ``outside`` (one GEMM
    before the launch), ``kernel`` (each program rotates its own x columns) or ``once``
    (the launch's first programs rotate x once into a workspace that the others read).

    Always ``outside`` for a rotation per group — in the kernel each program would read d²
    values per group, 4d/block_n times the group's index bytes (8× at d = 128 and 64-row
    tiles, at every M), and keep one per pipeline stage in shared memory — and with
    float32 operands on a GPU, where Π alone takes 64 KB of shared memory at d = 128 and
    two passes on 64-row tiles need more than an SM's 227 KB; and for groups wider than
    :data:`ROTATION_MAX_GROUP` (``wide_group``), whose Π (128 KB at d = 256 in 16 bits) leaves
    too little beside the tiles: compiled for sm_90, 64 × 64 tiles at d = 256 take 147,456 B
    with x rotated outside, 163,840 B (spilling) with the rotation once and 311,296 B with it
    in every program, more than any GPU has. A shared 16-bit rotation
    goes where ``QUANTCORE_TURBOQUANT_MMA_ROTATION`` says, else ``once`` when the config's
    ``rotate_once`` is True, ``kernel`` when its ``rotate_in_kernel`` is True. Not in the
    kernel by default: on the H100 the in-kernel rotation takes an eager call from 2.1× to
    1.1× nn.Linear's host time at M = 16, but its CUDA-graph time from 43 to 58–60 µs at
    M = 1–16 and from 84–87 to 155–169 µs at M = 128 (4096×14336, 14336×4096; README.md,
    "Rotation inside the tensor-core kernel"). ``once`` is one launch without the repeated
    rotation; its GPU time is 4–8 % over the outside variant's on the large shapes, up to 40 %
    at 4096×4096 (README.md), so a call recorded into a CUDA graph keeps the GEMM.

    ``eager_macs``: the work of an eager call (None for a call being recorded into a CUDA
    graph, or where the host's cost does not matter). A config that leaves the place open
    (``rotate_in_kernel`` None, not ``rotate_once``) then takes ``once`` up to
    :data:`EAGER_ONCE_MAX_MACS`: one launch instead of a GEMM and a launch. A tile of more
    than :data:`ROTATION_MAX_BLOCK_M` rows of x always takes x rotated outside."""
    if rotation_per_group or fp32_operands or wide_group or cfg.block_m > ROTATION_MAX_BLOCK_M:
        return "outside"
    forced = os.environ.get(ROTATION_ENV)
    if forced:
        if forced not in MMA_ROTATIONS:
            raise InvalidArgumentError(f"{ROTATION_ENV}: expected 'outside', 'kernel' or 'once', got {forced!r}")
        return forced
    if cfg.rotate_once:
        return "once"
    if cfg.rotate_in_kernel is None and eager_macs is not None and eager_macs <= EAGER_ONCE_MAX_MACS:
        return "once"
    return "kernel" if cfg.rotate_in_kernel is True else "outside"


def rotate_in_kernel(cfg: MmaConfig, *, rotation_per_group: bool = False, fp32_operands: bool = False,
                     wide_group: bool = False) -> bool:
    """Whether each program of the tensor-core kernel rotates its own x columns
    (:func:`mma_rotation` is ``kernel``); the tile rule follows it."""
    return mma_rotation(cfg, rotation_per_group=rotation_per_group, fp32_operands=fp32_operands,
                        wide_group=wide_group) == "kernel"


def path_for(card: CardKey | None) -> PathChoice:
    hit = table(card).get(("paths",))
    return hit if isinstance(hit, PathChoice) else PathChoice()
