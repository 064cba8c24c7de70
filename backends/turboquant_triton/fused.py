"""``fused_linear``: one TurboQuant linear (every pass, or one pass with a running
``partial``) on the path that suits M, chosen here:

* M = 1 — ``gemv.py``: CUDA-core decode kernel, rotation fused in, split over K, all
  passes in one launch;
* M ≤ 8 where the card's own table names it for the layer (``configs.mma_decode_config``) —
  ``decode_mma.py``: the looked-up weight straight into ``mma.sync``'s registers, every pass's
  rotation in one GEMM before it, all passes one GEMV of depth P·K in one launch;
* M ≤ ``mma_max_m`` — ``mma.py``: tensor-core kernel, split over K, all passes in one
  launch; the input is rotated once per call by one small GEMM for every pass before it
  (``quantcore/kernels/turboquant/rotation.py``; the default in a CUDA graph, and always
  for a rotation per group or in float32), or — a shared 16-bit rotation — the launch's
  first programs rotate x once into a kept workspace for the others (``once``: what an
  eager call of small work takes, one launch instead of two), or, asked for, each program
  rotates its own x columns (``configs.mma_rotation``);
* larger M — ``dequant.py``: dequantize every pass into a scratch, rotate the input (the
  same one GEMM), one cuBLAS GEMM of depth P·K; or, from ``fold_from_m``, ``fold.py``: every
  pass and its rotation folded into one dense weight, one cuBLAS GEMM of depth K on x as
  it comes (two launches, no input rotation).

The thresholds come from ``configs.path_for`` (measured per device). Layouts: indices
are read as int32 words (natural coordinate order, ``lookup.py``), scales are float32
``norms / √d``, rotations ``P = Πᵀ`` in the compute dtype (``split_halves=False``).

What depends only on the layer, the dtypes and the M bucket (``configs.m_bucket``) — the
config, the split, the constexprs, the index words, the rotations side by side, the
compiled kernel bound to its launcher (:class:`quantcore.triton.launch.Launch`), per M
the grid — is decided on a bucket's first call (of that M)
and kept with the layer's codebook tensor (:func:`quantcore.triton.launch.launch_state`;
a prepared state holds one codebook), checked against the pass tensors it was made for:
the custom op rebuilds the state objects around the same tensors at every call, and passes
handed in from elsewhere (the offload path's scratch views) get buckets of their own. The
kernel's own eager call (``prepared_linear``) also remembers the bucket it took in the
prepared state, per activation dtype and M: a later call neither chooses a path nor builds
the bucket's key, it checks the bucket still fits the state and launches.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton

from quantcore.kernel import Requirements
from quantcore.kernels.turboquant.base import PassData, TurboQuantPrepared, rotate_input
from quantcore.kernels.turboquant.rotation import InputRotation
from quantcore.probe import probe
from quantcore.probe.card import CardKey
from quantcore.probe.card_tables import card_of
from quantcore.tensors import laid_out, version_of
from quantcore.triton import GLUON_BELOW, TESTED_TRITON
from quantcore.triton.buffers import capturing, stream_key
from quantcore.triton.launch import Launch, launch_state
from quantcore.triton.unowned import unowned

from . import configs, decode_mma
from .dequant import dequant_kernel
from .fold import fold_kernel
from .gemv import gemv_kernel, rotate_kernel
from .lookup import to_output
from .mma import mma_kernel
from .operand import MIN_GROUP, coordinate_order
from .pairs import half_codebook
from .workspace import rotation_buffers, split_k_buffers

__all__ = ["default_path", "fused_linear", "interpreting", "prepared_linear"]

#: Re-exported for the NaN-rounding regression test.
_to_output = to_output
#: The arguments Triton specialises that change between calls of a bucket: the activation
#: (the decode kernel's second pass reads its own), the running partial; for the
#: tensor-core kernel M and the number of z-slices of rotation programs.
GEMV_VARYING = (0, 1, 10)
MMA_VARYING = (0, 9, 15, 19)
#: The tensors of a bucket at every call of its launch, handed to the launcher as addresses:
#: the index words, scales and rotations of both passes, the codebook, the bias (or the
#: codebook in its place); and the ticket pointer, which is the codebook when K is not split.
GEMV_FIXED = (2, 3, 4, 5, 6, 7, 8, 11)
GEMV_TICKETS = 13
MMA_FIXED = (1, 2, 3, 4, 5, 6, 7, 10)
MMA_TICKETS = 12
#: The tensor-core kernel's rotated-x workspace and its counts: the codebook unless the
#: launch's first programs rotate x once.
MMA_ROTATED = (13, 14)
#: The mma.sync decode kernel's rotated x and M; its indices, scales, codebook and bias (the
#: codebook in its place); its split-K workspace and counters when K is not split.
MMA_DECODE_VARYING = (0, 10)
MMA_DECODE_FIXED = (1, 2, 3, 4, 5, 6)
MMA_DECODE_SPLIT_K = (8, 9)
#: The dequantization kernel's codebook (its index words and scales are each pass's).
DEQUANT_FIXED = (2,)
#: The fold kernel's index words, scales and rotations of both passes and the codebook.
FOLD_FIXED = (0, 1, 2, 3, 4, 5, 6)
#: A dequantization program: rows, and columns of a row (whole groups, at least one);
#: H200 (tools/probes/turboquant_prefill_parts.py): 4 rows × 1024 columns on one warp write
#: 4096 × 14336 in 45.4 µs (76 % of the copy bandwidth), 32 × 256 on 4 warps took 72.4.
DEQUANT_ROWS = 4
DEQUANT_COLUMNS = 1024
DEQUANT_WARPS = 1


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


#: The path thresholds per device, read on the device's first call (configs.path_for).
_paths: dict[torch.device, configs.PathChoice] = {}


def _card(device: torch.device) -> CardKey | None:
    """What the tuned tables are keyed by (None on the CPU and under the interpreter)."""
    return card_of(device)


#: What the ``mma.sync`` decode kernel (Gluon) needs of the installed Triton.
_GLUON_NEEDS = Requirements(device_types=frozenset({"cuda"}), packages=("triton",), min_versions=(TESTED_TRITON,),
                            below_versions=(GLUON_BELOW,))
_gluon_compiles: dict[torch.device, bool] = {}


def _gluon_ok(device: torch.device) -> bool:
    """Whether this Triton compiles the Gluon decode kernel on ``device`` (decided once)."""
    ok = _gluon_compiles.get(device)
    if ok is None:
        ok = _gluon_compiles[device] = _GLUON_NEEDS.check(probe(device)) is None
    return ok


def _path_choice(device: torch.device) -> configs.PathChoice:
    choice = _paths.get(device)
    if choice is None:
        choice = _paths[device] = configs.path_for(_card(device))
    return choice


def _eager(device: torch.device) -> bool:
    """Whether a call on ``device`` launches on a GPU now, not into a CUDA graph being recorded."""
    return device.type == "cuda" and not torch.cuda.is_current_stream_capturing()


def _rotated_fp32(x2d: torch.Tensor, rotation: torch.Tensor, d: int, gpc: int, warps: int) -> torch.Tensor:
    """x_rot of a decode row in float32, each split's ``gpc`` groups rotated once
    (``prerotate``), by the decode kernel's own dot and warps."""
    groups = x2d.shape[1] // d
    out = torch.empty(1, x2d.shape[1], dtype=torch.float32, device=x2d.device)
    rotate_kernel[(triton.cdiv(groups, gpc),)](x2d, rotation, out, N_GROUPS=groups, D=d, GPC=gpc,
                                               DOT_FP32=_dot_fp32(x2d.dtype), num_warps=warps, num_stages=1)
    return out


def rotation_fits(card: CardKey | None, d: int, x_dtype: torch.dtype, rotation_dtype: torch.dtype,
                  lookup: str) -> bool:
    """Whether a decode program on ``card`` can hold the shared rotation it applies to x
    (always under the interpreter, where ``card`` is None: no shared memory to run out of).
    On a GPU the dot runs in float32 where x or Π is float32, or they differ."""
    if card is None:
        return True
    dot_fp32 = x_dtype == torch.float32 or x_dtype != rotation_dtype
    return configs.gemv_rotation_bytes(d, dot_fp32, lookup) <= card.smem_kib * 1024


def _words(indices: torch.Tensor) -> torch.Tensor:
    """[N, K/2] uint8 → [N, K/8] int32 (no copy: prepared indices are contiguous and aligned)."""
    return laid_out(indices).view(torch.int32)


def _dot_fp32(dtype: torch.dtype) -> bool:
    return interpreting() or dtype == torch.float32


class _Bucket:
    """What one path launches for one layer (its passes, codebook and bias), activation
    and output dtypes, partial or not, and M bucket."""

    def __init__(self, passes: Sequence[PassData], codebook: torch.Tensor, bias: torch.Tensor | None,
                 device: torch.device) -> None:
        self.passes, self.bias, self.device = tuple(passes), bias, device
        self.p1, self.p2 = passes[0], passes[-1]
        self.n, half = passes[0].indices.shape
        self.k = 2 * half
        # The codebook owns the launch state this is kept in: bound as a tensor over its
        # memory that does not refer to it (quantcore/triton/unowned.py).
        self.codebook = unowned(codebook)
        self.bias_or_cb = bias if bias is not None else self.codebook
        #: The input rotation the host runs before the launch, if any.
        self.rotate: InputRotation | None = None
        #: Per (stream, M): the kept scratch arrays a launch there uses (workspace.py).
        self._scratch: dict[tuple[Any, int], tuple[torch.Tensor, ...]] = {}

    def scratch(self, m: int, make: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        """``make()``'s kept arrays for a launch of ``m`` rows on the current stream, looked
        up once per stream and M: an array a larger launch later outgrows is retired, never
        freed, and still holds what this one needs. Those handed out while a graph is being
        captured may be that graph's alone and are not remembered."""
        key = (stream_key(self.device), m)
        hit = self._scratch.get(key)
        if hit is None:
            hit = make()
            if not capturing(self.device):
                self._scratch[key] = hit
        return hit

    def fits(self, passes: Sequence[PassData], bias: torch.Tensor | None) -> bool:
        """Made for these tensors (the custom op rebuilds the pass objects around the same
        tensors at every call), and their rotations unchanged since."""
        mine = self.passes
        if self.bias is not bias:
            return False
        if passes is not mine:  # the very tuple it was made from (a prepared state's) needs no look inside
            if len(passes) != len(mine):
                return False
            for a, b in zip(mine, passes, strict=True):
                if a.indices is not b.indices or a.scales is not b.scales or a.rotation is not b.rotation:
                    return False
        return self.rotate is None or self.rotate.current()


def _lookup(asked: str, codebook: torch.Tensor, device: torch.device) -> str:
    """``asked``, or ``pairs`` in place of ``half_pairs`` where the codebook does not round to
    fp16 within 2⁻¹¹ or cannot be read now (a bucket first made inside a CUDA-graph capture)."""
    if asked != "half_pairs":
        return asked
    return "half_pairs" if not capturing(device) and half_codebook(codebook) else "pairs"


class _Gemv(_Bucket):
    def __init__(self, x_dtype: torch.dtype, passes: Sequence[PassData], codebook: torch.Tensor, d: int,
                 partial: bool, bias: torch.Tensor | None, device: torch.device,
                 cfg: configs.GemvConfig | None) -> None:
        super().__init__(passes, codebook, bias, device)
        n, k = self.n, self.k
        groups = k // d
        cfg = cfg or configs.gemv_config(_card(device), k, n, d, len(passes), x_dtype)
        self.gpc = gpc = min(cfg.gpc, 1 << (groups - 1).bit_length(), 16)
        self.warps, self.d = cfg.warps, d
        self.split = split = triton.cdiv(groups, gpc)
        chunks = max(1, min(triton.cdiv(n, cfg.br), round(cfg.ctas / split)))
        rows_cta = triton.cdiv(triton.cdiv(n, chunks), cfg.br) * cfg.br
        self.chunks = triton.cdiv(n, rows_cta)
        shared = passes[0].rotation.shape[0] == 1
        lookup = _lookup(cfg.lookup, codebook, device)
        # A program holds Π in shared memory to rotate x: where it would not fit the card
        # (d = 256 in float32, d = 512), x is rotated by a GEMM before the launch.
        shared = shared and rotation_fits(_card(device), d, x_dtype, passes[0].rotation.dtype, lookup)
        #: ``prerotate``: a shared rotation applied once per split in float32 by its own
        #: launch, the decode kernel then reading x rotated.
        self.prerotate = shared and cfg.prerotate
        self.shared = shared and not self.prerotate
        x_dot = x_dtype if self.shared else torch.float32 if self.prerotate else passes[0].rotation.dtype
        p1, p2 = self.p1, self.p2
        self.weights = (_words(p1.indices), p1.scales, p1.rotation, _words(p2.indices), p2.scales, p2.rotation,
                        self.codebook)
        options: dict[str, int] = dict(num_warps=cfg.warps, num_stages=1)
        if cfg.maxnreg and not interpreting():
            options["maxnreg"] = cfg.maxnreg
        pdl = cfg.pdl and device.type == "cuda" and not interpreting() and torch.cuda.get_device_capability(device) >= (9, 0)
        if pdl:
            options["launch_pdl"] = True
        self.launch = Launch(
            gemv_kernel, device=device, varying=GEMV_VARYING, options=options,
            fixed_pointers=GEMV_FIXED + ((GEMV_TICKETS,) if split == 1 else ()),
            constexprs=dict(
                N_GROUPS=groups, D=d, GPC=gpc, SPLIT=split, SPLIT_P2=triton.next_power_of_2(split),
                ROWS_CTA=rows_cta, BR=cfg.br, TAIL=min(128, triton.next_power_of_2(rows_cta)), UNROLL=cfg.unroll,
                TWO_PASSES=len(passes) == 2, X_ROTATED=not self.shared, HAS_PARTIAL=partial,
                HAS_BIAS=bias is not None, INTERPRET=interpreting(),
                # x and Π of different dtypes (a float32 layer called in bf16) meet in float32.
                DOT_FP32=_dot_fp32(x_dot) or x_dot != passes[0].rotation.dtype,
                LOOKUP=configs.LOOKUPS.index(lookup), PDL=pdl, HALVES=cfg.halves and gpc * d // 8 % 8 == 0,
            ),
        )

    def _rotated(self, x2d: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
        if self.prerotate:
            return _rotated_fp32(x2d, rotation, self.d, self.gpc, self.warps)
        return rotate_input(x2d, rotation)

    def __call__(self, x2d: torch.Tensor, partial: torch.Tensor | None, out: torch.Tensor) -> None:
        if self.shared:
            x1 = x2 = x2d
        else:
            x1 = self._rotated(x2d, self.p1.rotation)
            x2 = x1 if self.p2 is self.p1 or self.p2.rotation is self.p1.rotation else self._rotated(
                x2d, self.p2.rotation)
        if self.split > 1:
            ws, tk = self.scratch(1, lambda: split_k_buffers(self.device, self.split * self.n, self.chunks))
        else:
            ws, tk = out, self.codebook
        self.launch((self.chunks, self.split, 1), x1, x2, *self.weights, out, partial if partial is not None else out,
                    self.bias_or_cb, ws, tk, self.n, self.k // 8, self.k // 8)


class _Mma(_Bucket):
    """The tensor-core kernel, x rotated by one GEMM before it, or inside it by every
    program or once by its first programs (one launch a call; ``configs.mma_rotation``)."""

    def __init__(self, m: int, x_dtype: torch.dtype, passes: Sequence[PassData], codebook: torch.Tensor, d: int,
                 partial: bool, bias: torch.Tensor | None, device: torch.device,
                 cfg: configs.MmaConfig | None, eager: bool = False) -> None:
        super().__init__(passes, codebook, bias, device)
        n, k = self.n, self.k
        self.groups = k // d
        p1, p2 = self.p1, self.p2
        own = p2 is not p1 and p2.rotation is not p1.rotation
        where = dict(rotation_per_group=p1.rotation.shape[0] != 1,
                     fp32_operands=p1.rotation.dtype == torch.float32 and not interpreting(),
                     wide_group=d > configs.ROTATION_MAX_GROUP)
        self.cfg = cfg or configs.mma_config(_card(device), m, k, n, d, len(passes), x_dtype, **where)
        self.tiles_n = triton.cdiv(n, self.cfg.block_n)
        #: ``outside``, ``kernel`` or ``once`` (configs.mma_rotation; an eager bucket's work
        #: counted at the top of its M bucket).
        eager_macs = configs.m_bucket(m) * n * k if eager else None
        self.rotation = configs.mma_rotation(self.cfg, **where, eager_macs=eager_macs)
        self.in_kernel, self.once = self.rotation == "kernel", self.rotation == "once"
        self.x_copies = 2 if own else 1
        #: The weight operand in its register layout (operand.py): 16-bit operands, d ≥ 64, and
        #: a warpgroup's 64 rows per warpgroup (with more warps than that, each warpgroup
        #: would look up the same rows again: twice the lookups at 8 warps on 64 rows).
        self.register_operand = (self.cfg.register_operand and d >= MIN_GROUP
                                 and self.cfg.block_n >= 16 * self.cfg.warps
                                 and (interpreting() or p1.rotation.dtype != torch.float32))
        if self.rotation == "outside":  # one rotated copy of x per distinct rotation, side by side (rotation.py)
            self.rotate = InputRotation((p1.rotation, p2.rotation) if own else (p1.rotation,),
                                        columns=coordinate_order(d) if self.register_operand else None)
        self.weights = (_words(p1.indices), p1.scales, p1.rotation, _words(p2.indices), p2.scales, p2.rotation,
                        self.codebook)
        self.constexprs = dict(
            N_GROUPS=self.groups, D=d, BLOCK_N=self.cfg.block_n, BLOCK_M=self.cfg.block_m,
            TWO_PASSES=len(passes) == 2, X_COPIES=self.x_copies, ROTATE=self.in_kernel, ROTATE_ONCE=self.once,
            REG_OPERAND=self.register_operand, SCALED=self.register_operand and self.cfg.scaled_operand,
            HAS_PARTIAL=partial, HAS_BIAS=bias is not None,
            DOT_FP32=_dot_fp32(passes[0].rotation.dtype), INTERPRET=interpreting(),
        )
        #: By (groups per program, split): both follow M's row tiles, within the bucket.
        self.launches: dict[tuple[int, int], Launch] = {}
        #: By M: the launch, its grid, its split and its output tiles.
        self.plans: dict[int, tuple[Launch, tuple[int, int, int], int, int, int]] = {}

    def _plan(self, m: int) -> tuple[Launch, tuple[int, int, int], int, int, int]:
        cfg = self.cfg
        tiles_m = triton.cdiv(m, cfg.block_m)
        # Split K only as far as needed to fill the GPU (each split costs a partial tile).
        split = max(1, min(triton.cdiv(self.groups, cfg.gpc), triton.cdiv(cfg.ctas, self.tiles_n * tiles_m)))
        gpc = triton.cdiv(self.groups, split)
        split = triton.cdiv(self.groups, gpc)
        launch = self.launches.get((gpc, split))
        if launch is None:
            fixed = MMA_FIXED + ((MMA_TICKETS,) if split == 1 else ()) + (() if self.once else MMA_ROTATED)
            launch = self.launches[(gpc, split)] = Launch(
                mma_kernel, device=self.device, varying=MMA_VARYING, constexprs=dict(self.constexprs, GPC=gpc, SPLIT=split),
                options=dict(num_warps=cfg.warps, num_stages=cfg.stages), fixed_pointers=fixed,
            )
        grid, rotating = (self.tiles_n, split, tiles_m), 0
        if self.once:  # z-slices of rotation programs (a chunk per rotation, group and row tile) first
            rotating = triton.cdiv(self.x_copies * self.groups * tiles_m, self.tiles_n * split)
            grid = (self.tiles_n, split, rotating + tiles_m)
            if interpreting():  # which runs a grid x-major: one dimension, in linear order (mma.py)
                grid = (grid[0] * grid[1] * grid[2], 1, 1)
        plan = self.plans[m] = (launch, grid, split, self.tiles_n * tiles_m, rotating)
        return plan

    def __call__(self, x2d: torch.Tensor, partial: torch.Tensor | None, out: torch.Tensor) -> None:
        m = x2d.shape[0]
        launch, grid, split, tiles, rotating = self.plans.get(m) or self._plan(m)
        x = x2d if self.rotate is None else self.rotate(x2d)
        if split > 1 or self.once:
            ws, tk, xr, counts = self.scratch(m, lambda: self._buffers(m, split, tiles))
        else:  # the launch reads none of them
            ws, tk, xr, counts = (self.codebook,) * 4
        if split <= 1:
            ws = out  # never read: one split stores its tile itself
        launch(grid, x, *self.weights, out, partial if partial is not None else out, self.bias_or_cb, ws, tk, xr,
               counts, m, self.n, self.k // 8, self.k // 8, rotating)

    def _buffers(self, m: int, split: int, tiles: int) -> tuple[torch.Tensor, ...]:
        """The split-K workspace and tickets and the rotated-x scratch and counts a launch of
        ``m`` rows takes (the codebook for what it does not read)."""
        ws, tk = split_k_buffers(self.device, split * m * self.n, tiles) if split > 1 else (self.codebook,) * 2
        if self.once:
            xr, counts = rotation_buffers(self.device, m * self.x_copies * self.k, self.p1.rotation.dtype)
        else:
            xr, counts = self.codebook, self.codebook
        return ws, tk, xr, counts


class _MmaDecode(_Bucket):
    """The ``mma.sync`` decode kernel (``decode_mma.py``, M ≤ 8, d = 128): every pass's
    rotation in one GEMM before it, then one launch over the passes' stored indices."""

    rotate: InputRotation

    def __init__(self, x_dtype: torch.dtype, passes: Sequence[PassData], codebook: torch.Tensor, d: int,
                 bias: torch.Tensor | None, device: torch.device, cfg: configs.MmaDecodeConfig) -> None:
        super().__init__(passes, codebook, bias, device)
        if device.type != "cuda" or interpreting():
            raise ValueError("the mma.sync decode kernel is a compiled Gluon kernel: a CUDA GPU, not the interpreter")
        if d != decode_mma.BK or x_dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"the mma.sync decode kernel takes groups of {decode_mma.BK} and 16-bit activations, "
                             f"got d = {d} and {x_dtype}")
        p, n, k = len(passes), self.n, self.k
        self.rotate = InputRotation([data.rotation for data in passes])
        self.groups = k // d
        self.split, constexprs = decode_mma.launch_constants(p, self.groups, cfg.split, tiles=cfg.tiles,
                                                             copies=cfg.copies, has_bias=bias is not None,
                                                             wide=cfg.wide, xvec=cfg.xvec)
        self.grid = (decode_mma.counters_size(n, cfg.tiles), self.split, 1)
        last = passes[-1]
        self.weights = (passes[0].indices.view(torch.int16), last.indices.view(torch.int16), passes[0].scales,
                        last.scales, self.codebook, self.bias_or_cb)
        self.launch = Launch(
            decode_mma.mma_decode_kernel, device=device, varying=MMA_DECODE_VARYING, options=dict(num_warps=4 * cfg.tiles),
            fixed_pointers=MMA_DECODE_FIXED + (MMA_DECODE_SPLIT_K if self.split <= 1 else ()),
            constexprs=constexprs,
        )

    def __call__(self, x2d: torch.Tensor, partial: torch.Tensor | None, out: torch.Tensor) -> None:
        m = x2d.shape[0]
        if not 1 <= m <= decode_mma.MAX_ROWS or partial is not None or out.dtype != x2d.dtype:
            raise ValueError(f"the mma.sync decode kernel takes 1 to {decode_mma.MAX_ROWS} rows, no running partial "
                             f"and its output in x's dtype; got {m} rows, partial {partial is not None}, {out.dtype}")
        kk = len(self.passes) * self.k
        x_rot = self.rotate(x2d).view(m, kk)
        if self.split > 1:
            ws, tk = self.scratch(m, lambda: split_k_buffers(self.device, self.split * m * self.n, self.grid[0]))
        else:  # never read: one program a tile stores it itself
            ws = tk = self.codebook
        self.launch(self.grid, x_rot, *self.weights, out, ws, tk, m, self.n, kk, self.groups, kk, out.stride(0),
                    self.split)


class _DenseGemm(_Bucket):
    """A prefill bucket: a kernel writes a dense weight into a scratch, cuBLAS multiplies."""

    def __init__(self, passes: Sequence[PassData], codebook: torch.Tensor, bias: torch.Tensor | None,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(passes, codebook, bias, device)
        self.dtype = dtype
        self.bias_cdt = bias.to(dtype) if bias is not None else None
        self.bias_version = version_of(bias) if bias is not None else -1

    def fits(self, passes: Sequence[PassData], bias: torch.Tensor | None) -> bool:
        """Also: ``bias_cdt`` (a copy in the compute dtype) still holds the bias."""
        return super().fits(passes, bias) and (bias is None or version_of(bias) == self.bias_version)

    def _gemm(self, x: torch.Tensor, w_t: torch.Tensor, partial: torch.Tensor | None, out: torch.Tensor) -> None:
        """``out = x · w_t (+ partial) (+ bias)``, ``x`` in the compute dtype."""
        cdt = self.dtype
        if partial is None and out.dtype == cdt:
            # cuBLAS accumulates in fp32 and rounds once into ``out``; the bias is added in its
            # epilogue. (An fp32 result re-read for the bias cost ~100 µs at N = 14336, M = 2048.)
            if self.bias_cdt is not None:
                torch.addmm(self.bias_cdt, x, w_t, out=out)
            else:
                torch.mm(x, w_t, out=out)
            return
        if x.device.type == "cuda" and cdt in (torch.bfloat16, torch.float16):
            y = torch.mm(x, w_t, out_dtype=torch.float32)  # the partial is fp32: one rounding
        else:
            y = torch.mm(x.to(torch.float32), w_t.to(torch.float32))
        if partial is not None:
            y += partial
        if self.bias is not None:
            y += self.bias
        out.copy_(y)


class _Dequant(_DenseGemm):
    """Dequantize every pass into ``W_cat [N, P·K]`` (``dequant.py``); the GEMM is torch's."""

    rotate: InputRotation

    def __init__(self, passes: Sequence[PassData], codebook: torch.Tensor, d: int, bias: torch.Tensor | None,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(passes, codebook, bias, device, dtype)
        n, k, p = self.n, self.k, len(passes)
        groups = k // d
        self.d, self.width = d, p * k
        block_n, gpc = DEQUANT_ROWS, max(1, DEQUANT_COLUMNS // d)
        gpc = min(gpc, 1 << (groups - 1).bit_length())
        self.grid = (triton.cdiv(n, block_n), triton.cdiv(groups, gpc), 1)
        self.launch = Launch(dequant_kernel, device=device, options=dict(num_warps=DEQUANT_WARPS),
                             fixed_pointers=DEQUANT_FIXED,
                             constexprs=dict(N_GROUPS=groups, D=d, BLOCK_N=block_n, GPC=gpc, PASSES=p,
                                             INTERPRET=interpreting()))
        self.per_pass = [(_words(data.indices), data.scales, self.codebook) for data in passes]
        #: ``x_cat``'s columns match ``W_cat``'s: every pass's copy, shared rotations too.
        self.rotate = InputRotation([data.rotation for data in passes])

    def dequantize(self, out: torch.Tensor) -> torch.Tensor:
        if out.shape != (self.n, self.width) or out.dtype != self.dtype or out.stride() != (self.width, 1):
            raise ValueError(f"W_cat: expected a contiguous [{self.n}, {self.width}] {self.dtype}, got "
                             f"{tuple(out.shape)} {out.dtype} strides {out.stride()}")
        self._write(out)
        return out

    def _write(self, w_cat: torch.Tensor) -> None:
        for p, weights in enumerate(self.per_pass):
            self.launch(self.grid, *weights, w_cat, self.n, self.k // 8, self.width, p * self.d)

    def __call__(self, x2d: torch.Tensor, partial: torch.Tensor | None, out: torch.Tensor) -> None:
        w_t = _scratch_for(self.device, self.dtype, self.n, self.width)
        self._write(w_t)
        self._gemm(self.rotate(x2d).view(x2d.shape[0], self.width), w_t, partial, out)


class _Folded(_DenseGemm):
    """Every pass folded into ``W_eff [N, K]`` with its rotation (``fold.py``); the GEMM
    is torch's, on x as it comes."""

    def __init__(self, passes: Sequence[PassData], codebook: torch.Tensor, d: int, bias: torch.Tensor | None,
                 device: torch.device, dtype: torch.dtype, config: configs.FoldConfig | None = None) -> None:
        super().__init__(passes, codebook, bias, device, dtype)
        groups = self.k // d
        config = config or configs.fold_config(d, len(passes))
        if d > configs.FOLD_MAX_GROUP and len(passes) == 2:
            raise ValueError(f"the fold kernel takes groups of at most {configs.FOLD_MAX_GROUP} columns with two "
                             f"passes (its operands would not fit an SM's shared memory), got {d}; use 'dequant'")
        tiles = triton.cdiv(self.n, config.block_n) * groups
        if config.persistent:
            programs = min(tiles, config.persistent * _sm_count(device))
            gpp, self.grid, self.iters = 1, (programs, 1, 1), triton.cdiv(tiles, programs)
        else:
            gpp = _dividing_power_of_two(groups, config.groups)
            self.grid, self.iters = (triton.cdiv(self.n, config.block_n), groups // gpp, 1), gpp
        rotations = [data.rotation.contiguous() for data in passes]
        register = config.register_operand and d >= MIN_GROUP and (interpreting() or dtype != torch.float32)
        options: dict[str, int] = dict(num_warps=config.warps)
        if config.maxnreg:
            options["maxnreg"] = config.maxnreg
        self.launch = Launch(fold_kernel, device=device, options=options, fixed_pointers=FOLD_FIXED,
                             constexprs=dict(N_GROUPS=groups, D=d, BLOCK_N=config.block_n, GPP=gpp,
                                             ITERS=self.iters, PERSISTENT=bool(config.persistent),
                                             PASSES=len(passes), SHARED1=rotations[0].shape[0] == 1,
                                             SHARED2=rotations[-1].shape[0] == 1, REG_OPERAND=register,
                                             STAGES=config.stages, DOT_FP32=_dot_fp32(dtype),
                                             INTERPRET=interpreting()))
        self.weights = (_words(self.p1.indices), self.p1.scales, rotations[0], _words(self.p2.indices),
                        self.p2.scales, rotations[-1], self.codebook)

    def fold(self, out: torch.Tensor) -> torch.Tensor:
        """``W_eff`` written into ``out`` (row-major [N, K], any row stride)."""
        self.launch(self.grid, *self.weights, out, self.n, self.k // 8, out.stride(0))
        return out

    def __call__(self, x2d: torch.Tensor, partial: torch.Tensor | None, out: torch.Tensor) -> None:
        w_t = _scratch_for(self.device, self.dtype, self.n, self.k)
        self.fold(w_t.t())
        self._gemm(x2d if x2d.dtype == self.dtype else x2d.to(self.dtype), w_t, partial, out)


def _sm_count(device: torch.device) -> int:
    """The device's SMs (4 for the interpreter's CPU: a few programs, every tile visited)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _dividing_power_of_two(n: int, most: int) -> int:
    """The largest power of two that divides ``n`` and is at most ``most`` (at least 1)."""
    p = 1
    while p * 2 <= most and n % (p * 2) == 0:
        p *= 2
    return p


def _scratch_for(device: torch.device, dtype: torch.dtype, n: int, width: int) -> torch.Tensor:
    """``W_catᵀ`` [P·K, N]: the transpose of the row-major [N, P·K] scratch the dequant
    kernel writes, as the GEMM reads it (one allocation, no view a call). From torch's
    caching allocator at every call, which hands the same block back call after call. (A
    module-level buffer grown in place broke CUDA graphs: a graph captured before the
    growth kept writing to the freed block.)"""
    return torch.empty_strided((width, n), (1, width), dtype=dtype, device=device)


def _kept(codebook: torch.Tensor, key: tuple[Any, ...], passes: Sequence[PassData], bias: torch.Tensor | None,
          make: Any, *args: Any) -> Any:
    """The bucket of ``key`` kept with the layer's codebook, made again (``make(*args)``)
    when the passes or the bias it was made for are not the ones given."""
    state = launch_state(codebook)
    bucket = state.get(key)
    if bucket is None or not bucket.fits(passes, bias):
        bucket = state[key] = make(*args)
    return bucket


def dequantize_rotated(passes: Sequence[PassData], codebook: torch.Tensor, d: int, dtype: torch.dtype,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """``W_cat [N, P·K]``: every pass's scaled centroids in the rotated basis, group g of
    pass p in columns ``(g·P + p)·d …`` (``dequant.py``)."""
    device = codebook.device
    bucket = _kept(codebook, ("dequant", dtype, None, id(passes[-1].indices), len(passes), device), passes, None,
                   _Dequant, passes, codebook, d, None, device, dtype)
    n, width = bucket.n, bucket.width
    return bucket.dequantize(out if out is not None else torch.empty((n, width), dtype=dtype, device=device))


def fused_linear(
    x2d: torch.Tensor,
    passes: Sequence[PassData],
    codebook: torch.Tensor,
    *,
    group_size: int,
    partial: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    path: str | None = None,
    config: Any = None,
) -> torch.Tensor:
    """``partial + Σ_passes x Ŵ_pᵀ (+ bias)`` as [M, N] in ``out_dtype``. ``path``
    ("gemv", "mma", "mma_decode", "dequant", "fold") and ``config`` override the choice
    (benchmarks, tests)."""
    if not 1 <= len(passes) <= 2:
        raise ValueError(f"fused_linear takes one or two passes, got {len(passes)}")
    return _chosen(x2d, passes, codebook, group_size, partial, bias, out_dtype, path, config)[0]


def _chosen(x2d: torch.Tensor, passes: Sequence[PassData], codebook: torch.Tensor, group_size: int,
            partial: torch.Tensor | None, bias: torch.Tensor | None, out_dtype: torch.dtype, path: str | None,
            config: Any) -> tuple[torch.Tensor, Any]:
    """The output of a call on the bucket :func:`_bucket` chooses, and that bucket (None at M = 0)."""
    if not x2d.is_contiguous():
        x2d = x2d.contiguous()
    m = x2d.shape[0]
    # The sizes as arguments, not one tuple: torch parses them faster (docs/triton-launch.md).
    out = torch.empty(m, passes[0].indices.shape[0], dtype=out_dtype, device=x2d.device)
    if m == 0:
        return out, None
    bucket = _bucket(x2d, passes, codebook, group_size, partial, bias, out, path, config)
    bucket(x2d, partial, out)
    return out, bucket


#: Where :func:`prepared_linear` keeps its buckets in a prepared state's ``cache``.
_ROUTES = object()
#: The most (dtype, M, eager) routes a prepared state remembers (a prefill sees many M).
MAX_ROUTES = 64


class _Routes(dict[tuple[Any, ...], Any]):
    """A prepared state's remembered buckets, for the codebook they were bound over (by weak
    reference: a copy's codebook is not kept alive by the state it was copied from): a
    state copied with ``dataclasses.replace`` shares its ``cache`` dict, and one given
    another codebook (moved, or another layer's) must not launch over the old one's."""

    __slots__ = ("codebook",)

    def __init__(self, codebook: torch.Tensor) -> None:
        super().__init__()
        self.codebook = weakref.ref(codebook)


def prepared_linear(x2d: torch.Tensor, prepared: TurboQuantPrepared) -> torch.Tensor:
    """:func:`fused_linear` of a prepared layer's own passes and bias, the output in x's
    dtype: the bucket a call takes is remembered in the prepared state's ``cache`` per
    (dtype, M, eager), so a later call looks it up once, checks it still fits the passes
    and the bias, and launches. A call recorded into a CUDA graph is not remembered (its
    buckets may be the recording's alone)."""
    m = x2d.shape[0]
    # ``is_cuda``, not ``x2d.device``: a device object is built per access (check_x put x
    # on the prepared state's device, which the bucket holds).
    eager = x2d.is_cuda and not torch.cuda.is_current_stream_capturing()
    routes = prepared.cache.get(_ROUTES)
    if routes is None or routes.codebook() is not prepared.codebook:
        routes = prepared.cache[_ROUTES] = _Routes(prepared.codebook)
    key = (x2d.dtype, m, eager)
    bucket = routes.get(key)
    if bucket is None or m == 0 or not x2d.is_contiguous() or not bucket.fits(prepared.passes, prepared.bias):
        return _remembered(routes, key, x2d, prepared, eager)
    out = torch.empty(m, bucket.n, dtype=x2d.dtype, device=bucket.device)
    bucket(x2d, None, out)
    return out


def _remembered(routes: _Routes, key: tuple[Any, ...], x2d: torch.Tensor, prepared: TurboQuantPrepared,
                eager: bool) -> torch.Tensor:
    """A call of :func:`prepared_linear` that finds no bucket to reuse: through
    :func:`fused_linear`'s choice, the bucket then kept for the key (not while recording)."""
    out, bucket = _chosen(x2d, prepared.passes, prepared.codebook, prepared.group_size, None, prepared.bias,
                          x2d.dtype, None, None)
    if bucket is not None and (eager or x2d.device.type != "cuda"):
        if len(routes) >= MAX_ROUTES:
            routes.clear()
        routes[key] = bucket
    return out


def default_path(m: int, x_dtype: torch.dtype, k: int, n: int, passes: int, group_size: int, has_partial: bool,
                 device: torch.device) -> tuple[str, Any]:
    """The path a call of ``m`` rows takes on ``device`` (M ≥ 1), and the config the card's
    table names for it where that is the ``mma.sync`` decode kernel (else None: the path
    looks its own up). That kernel runs where the card's own table names it for the layer
    and rows (``configs.mma_decode_config``), never with a running partial."""
    if not has_partial:
        cfg = configs.mma_decode_config(_card(device), m, k, n, group_size, passes, x_dtype)
        if cfg is not None and _gluon_ok(device):
            return "mma_decode", cfg
    choice = _paths.get(device) or _path_choice(device)
    if m <= choice.gemv_max_m:
        return "gemv", None
    return ("mma" if m <= choice.mma_max_m else choice.prefill_path(m, passes, group_size)), None


def _bucket(x2d: torch.Tensor, passes: Sequence[PassData], codebook: torch.Tensor, group_size: int,
            partial: torch.Tensor | None, bias: torch.Tensor | None, out: torch.Tensor, path: str | None,
            config: Any) -> Any:
    """The bucket a call of ``x2d`` (contiguous, M ≥ 1) takes, on ``path`` or the one M
    calls for; the first eager call at an M of the tensor-core path also runs the plan a
    recording will take (into ``out``, which the call then overwrites)."""
    m = x2d.shape[0]
    device = x2d.device
    out_dtype = out.dtype
    has_partial = partial is not None
    if path is None:
        n, half = passes[0].indices.shape
        path, table_config = default_path(m, x2d.dtype, 2 * half, n, len(passes), group_size, has_partial, device)
        config = config if config is not None else table_config
    if path == "mma_decode" and config is None:  # asked for by name: the table's config for these rows, or the default
        n, half = passes[0].indices.shape
        config = (configs.mma_decode_config(_card(device), m, 2 * half, n, group_size, len(passes), x2d.dtype)
                  or configs.MmaDecodeConfig())
    key = (path, configs.m_bucket(m) if path == "mma" else 0, x2d.dtype, out_dtype, has_partial, config,
           id(passes[-1].indices), len(passes), device)
    if path == "gemv":
        if m != 1:
            raise ValueError(f"the decode kernel takes M = 1, got M = {m}")
        return _kept(codebook, key, passes, bias, _Gemv, x2d.dtype, passes, codebook, group_size, has_partial,
                     bias, device, config)
    if path == "mma":
        # An eager call and one being recorded into a CUDA graph may take different plans: the
        # first pays the host for every launch, the second only the GPU (configs.mma_rotation).
        make = (_Mma, m, x2d.dtype, passes, codebook, group_size, has_partial, bias, device, config)
        if not _eager(device):
            return _kept(codebook, key, passes, bias, *make)
        bucket = _kept(codebook, (*key, "eager"), passes, bias, *make, True)
        if m not in bucket.plans:
            # A graph is recorded after eager calls at its M (engines warm each captured
            # batch size up), and a recording cannot compile: the first eager call at an
            # M also makes, compiles and runs the plan a recording will take.
            _kept(codebook, key, passes, bias, *make)(x2d, partial, out)
        return bucket
    if path == "mma_decode":
        return _kept(codebook, key, passes, bias, _MmaDecode, x2d.dtype, passes, codebook, group_size, bias, device,
                     config)
    if path in ("dequant", "fold"):
        return _kept(codebook, key, passes, bias, _Dequant if path == "dequant" else _Folded, passes, codebook,
                     group_size, bias, device, passes[0].rotation.dtype)
    raise ValueError(f"path: expected 'gemv', 'mma', 'mma_decode', 'dequant' or 'fold', got {path!r}")
