"""Launching the kernel: the plan, the TMA descriptors, the grid and the split-K buffers.
Imports triton (through kernels.py): load it only when a call runs (or a probe compiles).

What depends only on the weight, the activation dtype and the plan is decided once and kept
with the weight's packed tensor (:class:`WgmmaBucket`, through
:func:`quantcore.triton.launch.launch_state`): the plan, the weight's TMA descriptors, the
split, the constexprs and the compiled kernel bound to its launcher
(:class:`quantcore.triton.launch.Launch`, which encodes the weight's descriptors once per
compiled kernel). Per call: x's descriptor, M, the output, the split-K workspace and the
grid.

A plan that is a :class:`~.plans.TritonPlan` (a table's choice at small M) runs the Triton
kernels over the same prepared words instead (``small_m.py``), a :class:`~.plans.DecodePlan`
the warp-level decode kernel (``decode_bucket.py``); their buckets are kept alike.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, NamedTuple

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from quantcore.errors import InvalidArgumentError
from quantcore.kernels.gated_activation import gated_activation
from quantcore.kernels.gptq_pairs.layout import SLICE, block_k
from quantcore.probe.card import CardKey, card_key
from quantcore.triton.launch import Launch, launch_state
from quantcore.triton.rotation_workspace import rotation_buffers
from quantcore.triton.split_k import SplitKBuffers
from quantcore.triton.unowned import unowned

from .configs import SMEM_RESERVE, Shape, gated_plan_for, lookup_plan, plan_for
from .decode_bucket import DecodeBucket
from .first_use import first_use_plan
from .kernels import wgmma_kernel
from .layout import TILE_N, HopperWeights, LookupWeights, bias_operand, bound_to, weight_source
from .plans import GATED_MAX_BM, AnyPlan, DecodePlan, Plan, TritonPlan, gated_plan_refusal
from .rotation_programs import Rotation, rotation_constexprs, rotation_rows
from .small_m import SmallMBucket

__all__ = ["GATED_MAX_BM", "GATED_ROWS", "Walk", "WgmmaBucket", "bucket_of", "gated_linear", "gated_plan_of", "gated_refusal", "kernel_args", "linear",
           "plan_of", "prepare_x", "split_steps"]

#: The arguments of ``wgmma_kernel`` that change between the calls of one bucket and that
#: Triton specialises: M. x's descriptor changes its base only: what Triton specialises of
#: a descriptor (dtype, box, layout) is the bucket's, and TMA needs the base 16-byte aligned
#: whatever the binary (``prepare_x`` sees to it). y and the workspace are fresh
#: allocations (aligned); the rest is the weight's.
VARYING = (8,)
#: The weight's descriptors (w, scales, zeros): the same objects at every call of a bucket,
#: so its launch encodes them once.
WEIGHT_DESCRIPTORS = (0, 2, 3)
#: The bias (the scales in its place without one), and the split-K workspace and counters
#: when K is not split (the scales stand in for them): the same tensors at every call of a
#: bucket, handed to the launcher as addresses.
WEIGHT_POINTERS = (4,)
SPLIT_K_BUFFERS = (6, 7)
#: A rotating bucket's (``rotation_programs.py``) layer x and rotation programs' rows (the
#: rotated x's workspace and the counts are kept buffers, passed as they are); its
#: rotation, the same tensor at every call. Without a rotation the four pointers are
#: fixed stand-ins.
ROTATION_VARYING = (15, 19)
ROTATION_FIXED = (16,)
ROTATION_POINTERS = (15, 16, 17, 18)
#: Distinct row counts a weight keeps buckets for before it forgets them (a server's batch
#: sizes repeat; a stream of ever new ones must not grow the table without bound).
MAX_RUNS = 256

#: Programmatic dependent launch (docs/pdl.md): ``off`` (the default), ``wait`` (the
#: launch may start before the previous kernel ends; every program waits for it first) or
#: ``prefetch`` (it also loads its weight's first stages before waiting).
PDL_ENV = "QUANTCORE_HOPPER_PDL"
PDL_MODES = {"off": 0, "wait": 1, "prefetch": 2}

#: A gated weight's I (N/2) is a multiple of the widest tile's rows, so that no tile holds
#: outputs of both halves and gate's tile and up's pair by column.
GATED_ROWS = 128

_GL_DTYPE = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32,
             torch.int16: gl.int16, torch.uint8: gl.uint8}
_cards: dict[int, CardKey] = {}


def _card(device: torch.device) -> CardKey:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _cards:
        _cards[index] = card_key(index)
    return _cards[index]


def sub_rows(w: HopperWeights) -> int:
    """Rows of scales one block reads (one, or block/SG when groups split a block)."""
    return max(1, block_k(w.bits) // w.sub_group)


def fit_stages(plan: Plan, w: HopperWeights, smem_bytes: int) -> Plan:
    """``plan`` with its ring no deeper than the card's shared memory holds."""
    per = plan.stage_bytes(w.bits, w.scales.element_size(), sub_rows(w), w.zeros is not None)
    most = max(2, (smem_bytes - SMEM_RESERVE - plan.fixed_bytes()) // per)
    return plan if plan.stages <= most else dataclasses.replace(plan, stages=most)


def plan_of(m: int, w: HopperWeights, device: torch.device) -> AnyPlan:
    card = _card(device)
    shape = Shape(m, w.in_features, w.out_features, w.bits)
    plan = lookup_plan(shape) if isinstance(w, LookupWeights) else plan_for(shape, card)
    return fit_stages(plan, w, card.smem_kib * 1024) if isinstance(plan, Plan) else plan


def gated_plan_of(m: int, w: HopperWeights, device: torch.device) -> AnyPlan | None:
    """The table's plan for a gated call of ``m`` rows where :func:`plan_of`'s cannot end
    gated (``configs.gated_plan_for``), or None."""
    card = _card(device)
    plan = gated_plan_for(Shape(m, w.in_features, w.out_features, w.bits), card)
    return fit_stages(plan, w, card.smem_kib * 1024) if isinstance(plan, Plan) else plan


def prepare_x(x: torch.Tensor) -> torch.Tensor:
    """x ``[..., K]`` as TMA reads it: contiguous, 16-byte aligned, K a multiple of 32 (else
    a zero-padded ``[M, K32]`` copy). Its rows are read from its storage: the descriptor
    takes M rows of ``shape[-1]`` elements from its base, whatever its rank."""
    k = x.shape[-1]
    k32 = -(-k // SLICE) * SLICE
    if k32 == k and x.is_contiguous() and x.data_ptr() % 16 == 0:
        return x
    x2 = x.reshape(-1, k)
    out = torch.zeros(x2.shape[0], k32, dtype=x.dtype, device=x.device)
    out[:, :k] = x2
    return out


def _nvmma(dtype: torch.dtype, rank: int, swizzle: int = 0) -> Any:
    bits = torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits
    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=bits, rank=rank)


def weight_descriptors(w: HopperWeights, wg: int) -> tuple[Any, Any, Any]:
    """The TMA descriptors of the prepared weight for ``wg`` tiles per CTA (cached with the
    tensors they describe: a state whose tensors were replaced gets new ones), on
    :func:`~quantcore.triton.unowned.unowned` tensors: the buckets in the weight's launch
    state hold them."""
    key = ("descriptors", wg)
    kept = w.runtime.get(key)
    if kept is not None and kept[0] is w.qweight and kept[1] is w.scales and kept[2] is w.zeros:
        return kept[3]  # type: ignore[no-any-return]
    tiles, blocks = w.tiles, w.blocks
    words = unowned(w.qweight.view(torch.int16).view(tiles, blocks * 8, 256))
    w_desc = TensorDescriptor(words, [tiles, blocks * 8, 256], [blocks * 2048, 256, 1], [wg, 8, 256],
                              _nvmma(torch.int16, 3))
    s = w.scales
    s_desc = TensorDescriptor(s, list(s.shape), [s.shape[1], 1], [1, TILE_N * wg], _nvmma(s.dtype, 2))
    # Without zero points the kernel never reads z_desc; any uint8 view will do.
    z = unowned(w.zeros if w.zeros is not None else w.qweight.view(torch.uint8).view(tiles, -1))
    z_desc = TensorDescriptor(z, list(z.shape), [z.stride(0), 1], [1, TILE_N * wg], _nvmma(torch.uint8, 2))
    have = (w_desc, s_desc, z_desc)
    w.runtime[key] = (w.qweight, w.scales, w.zeros, have)
    return have


class XDescriptor:
    """x's TMA descriptors for one activation dtype, weight width and plan: x ``[M, K]``
    viewed as ``[K/32, M, 32]``, one box being one block's slices."""

    __slots__ = ("box", "layout")

    def __init__(self, dtype: torch.dtype, bits: int, bm: int) -> None:
        self.box = [16 // bits, bm, SLICE]
        self.layout = _nvmma(dtype, 3, 64)  # a [bm, 32] 16-bit tile: 64-byte rows

    def checked(self, x: torch.Tensor) -> Any:
        """The descriptor, through TensorDescriptor's checks."""
        m, k = x.shape
        return TensorDescriptor(x, [k // SLICE, m, SLICE], [SLICE, k, 1], self.box, self.layout)

    def __call__(self, x: torch.Tensor, m: int, k: int | None = None) -> Any:
        """The same descriptor over the ``m`` rows of ``x`` ``[..., K]`` (or a flat buffer of
        at least ``m·k`` elements: the rotated x's workspace) without
        TensorDescriptor's checks (microseconds a call): for an x that ``prepare_x`` returned
        (16-byte aligned base, contiguous, K a multiple of 32, so every stride is a multiple
        of 16 bytes) with M > 0 (the kernel is never called with none), every check that
        depends on x passes; the box and the layout depend on the plan alone, and are those
        :meth:`checked` (the plain path, ``kernel_args``) checks."""
        k = x.shape[-1] if k is None else k
        desc = _new(TensorDescriptor)
        desc.base, desc.shape, desc.strides = x, [k // SLICE, m, SLICE], [SLICE, k, 1]
        desc.block_shape, desc.layout, desc.padding = self.box, self.layout, "zero"
        return desc


_new = object.__new__


def x_descriptor(x: torch.Tensor, bits: int, bm: int) -> Any:
    """x's descriptor (:class:`XDescriptor`), checked."""
    return XDescriptor(x.dtype, bits, bm).checked(x)


class Walk(NamedTuple):
    """How the programs of one launch walk K."""

    #: Blocks per program (the last one may get fewer).
    steps: int
    #: Programs along K.
    split: int
    #: Blocks between two full waits (1 or 2).
    per_wait: int
    #: Whether each block's wgmma groups stay in flight while the next one is dequantized.
    in_flight: bool


def split_steps(w: HopperWeights, plan: Plan) -> Walk:
    """The walk of ``plan`` over ``w``: pairs of blocks (per wait, or in flight) only where
    every program gets an even count, else one block per wait."""
    steps = triton.cdiv(w.blocks, plan.split)
    pairs = w.blocks % 2 == 0
    per_wait = plan.per_wait if pairs else 1
    in_flight = plan.in_flight and pairs
    steps += steps % (2 if per_wait == 2 or in_flight else 1)
    return Walk(steps, triton.cdiv(w.blocks, steps), per_wait, in_flight)


def stream_grid(w: HopperWeights, plan: Plan, m: int, sms: int) -> tuple[int, int]:
    """``(programs, workspace slots)`` of a balanced grid (``Plan.stream``) for ``m`` rows:
    the programs cut the tiles' pairs of K blocks into equal runs; the slots are the most
    programs any one tile is shared by."""
    if w.blocks % 2:
        raise InvalidArgumentError(f"hopper_wgmma: a balanced grid walks pairs of K blocks; this weight has "
                                   f"{w.blocks} blocks (K = {w.in_features})")
    pairs = w.blocks // 2
    units = triton.cdiv(w.out_features, TILE_N * plan.wg) * triton.cdiv(m, plan.bm) * pairs
    grid = max(1, min(units, sms * plan.stream))
    owner = [((u + 1) * grid - 1) // units for u in range(0, units, pairs)]
    last = [((u + pairs) * grid - 1) // units for u in range(0, units, pairs)]
    return grid, max(b - a + 1 for a, b in zip(owner, last, strict=True))


def kernel_args(x: torch.Tensor, w: HopperWeights, plan: Plan, y: torch.Tensor, ws: torch.Tensor,
                counters: torch.Tensor) -> tuple[tuple[int, int], list[Any], dict[str, Any]]:
    """``(grid, positional args, constexprs + launch options)`` of one launch."""
    m = x.shape[0]
    n = w.out_features
    walk = split_steps(w, plan)
    steps, split = walk.steps, walk.split
    w_desc, s_desc, z_desc = weight_descriptors(w, plan.wg)
    tiles = triton.cdiv(n, TILE_N * plan.wg) * triton.cdiv(m, plan.bm)
    grid = (tiles, split)
    if plan.stream:
        programs, split = stream_grid(w, plan, m, _sms(x.device))
        grid = (programs, 1)
    args = [w_desc, x_descriptor(x, w.bits, plan.bm), s_desc, z_desc, bias_operand(w), y, ws, counters,
            m, n, y.stride(0), w.blocks, steps, split, w.sub_group, *(w.scales,) * 4, 0]  # no rotation: stand-ins
    const = dict(_constexprs(w, plan, walk), num_warps=plan.num_warps)
    if plan.maxnreg:
        const["maxnreg"] = plan.maxnreg
    return grid, args, const


def _sms(device: torch.device) -> int:
    """SMs of ``device`` (a CPU stands for an H100's 132: the sm_90a compile probes)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def pdl_mode() -> int:
    """The programmatic-dependent-launch mode :data:`PDL_ENV` names (0 when unset)."""
    name = os.environ.get(PDL_ENV, "off").strip().lower() or "off"
    if name not in PDL_MODES:
        raise InvalidArgumentError(f"{PDL_ENV}: expected one of {list(PDL_MODES)}, got {name!r}")
    return PDL_MODES[name]


def _constexprs(w: HopperWeights, plan: Plan, walk: Walk) -> dict[str, Any]:
    bk = block_k(w.bits)
    slices_per_row = (16 // w.bits) if w.sub_group >= bk else w.sub_group // SLICE
    pdl = pdl_mode()
    # The producer warp walks the in-flight order; where the walk falls back to a wait per
    # block (an odd block count), or programmatic dependent launch is asked for (the producer
    # would issue loads before the wait that orders them), the plan runs without it: the
    # same tile and walk, the consumers issuing the loads.
    ws = plan.ws and walk.in_flight and not pdl
    # Late scaling folds one scale row per block, of 4-bit codes; elsewhere the same tile
    # and walk run with the scale in the operand.
    late = plan.late_scale and walk.in_flight and w.bits == 4 and sub_rows(w) == 1
    const = dict(LATE=late, BITS=w.bits, ROWS=sub_rows(w), SLICES_PER_ROW=slices_per_row, SPLIT=walk.split > 1,
                 HAS_ZEROS=w.zeros is not None, HAS_BIAS=w.bias is not None, WG=plan.wg, BM=plan.bm,
                 STAGES=plan.stages, PER_WAIT=walk.per_wait, IN_FLIGHT=walk.in_flight, PDL=pdl, WS=ws,
                 STREAM=bool(plan.stream), LOOKUP=isinstance(w, LookupWeights), GATED=False,
                 **rotation_constexprs(None))
    if plan.stream and (pdl or not walk.in_flight):
        raise InvalidArgumentError(f"hopper_wgmma: a balanced grid runs in flight without {PDL_ENV}; "
                                   f"got {PDL_ENV}={pdl}, in flight {walk.in_flight}")
    return const


class WgmmaBucket:
    """One plan of one weight for one activation dtype and device: everything a call of
    that plan launches that does not depend on the activation."""

    #: The twin bucket of gated calls (:func:`gated_linear`), made on the first; False where
    #: the plan cannot end gated.
    gated: WgmmaBucket | DecodeBucket | bool | None = None

    #: The twin bucket that rotates x in its launch (``turboquant_launch.py``); False where
    #: the rotation cannot run there.
    rotated: WgmmaBucket | bool | None = None

    def __init__(self, w: HopperWeights, dtype: torch.dtype, device: torch.device, plan: Plan, *,
                 gated: bool = False, rotation: Rotation | None = None) -> None:
        if plan.stream:
            raise InvalidArgumentError(f"hopper_wgmma: a balanced grid is timed through linear(x, w, plan) only, "
                                       f"not bound from a table: {plan}")
        self.plan, self.dtype, self.device = plan, dtype, device
        #: The weight's tensors as bound: a state whose fields were replaced is bound again.
        #: The packed tensor by weak reference: it owns the launch state this is kept in.
        self.source = weight_source(w)
        n = w.out_features
        self.n, self.out = n, n // 2 if gated else n
        walk = split_steps(w, plan)
        self.split = walk.split
        self.split_k = SplitKBuffers(walk.split, device, w.scales, always=gated)
        self.n_tiles = -(-n // (TILE_N * plan.wg))
        w_desc, s_desc, z_desc = weight_descriptors(w, plan.wg)
        self.w_desc = w_desc
        self.x_desc = XDescriptor(dtype, w.bits, plan.bm)
        self.mid = (s_desc, z_desc, bias_operand(w))
        self.tail = (n, self.out, w.blocks, walk.steps, walk.split, w.sub_group)  # N, stride_ym (y contiguous), …
        constexprs = dict(_constexprs(w, plan, walk), GATED=gated, **rotation_constexprs(rotation))
        # The launch attribute lets the launch start before the previous kernel ends; the
        # kernel's PDL constexpr makes it wait where it must (without it, the wait is a no-op).
        pdl = {"launch_pdl": True} if constexprs["PDL"] else {}
        regs = {"maxnreg": plan.maxnreg} if plan.maxnreg else {}
        split_k = SPLIT_K_BUFFERS if self.split <= 1 and not gated else ()
        varying, fixed = VARYING, WEIGHT_POINTERS + split_k + ROTATION_POINTERS
        self.unrotated = (*self.tail, w.scales, w.scales, w.scales, w.scales, 0)  # no rotation: stand-ins
        if rotation is not None:
            if constexprs["PDL"]:
                raise InvalidArgumentError(f"hopper_wgmma: the rotation in the launch runs without {PDL_ENV}")
            varying, fixed = VARYING + ROTATION_VARYING, WEIGHT_POINTERS + split_k + ROTATION_FIXED
            self.rhs, self.operand = rotation.source, rotation.operand
            self.groups, self.k = w.in_features // rotation.cols, w.in_features
        self.launch = Launch(wgmma_kernel, constexprs=constexprs,
                             options=dict(num_warps=plan.num_warps, **pdl, **regs),
                             varying=varying, fixed_descriptors=WEIGHT_DESCRIPTORS, fixed_pointers=fixed,
                             device=device)

    def fits(self, w: HopperWeights) -> bool:
        return bound_to(self.source, w)

    def __call__(self, x: torch.Tensor, w: HopperWeights, m: int) -> torch.Tensor:
        """``y`` ``[..., N]`` (gated: ``[..., N/2]``) for the ``m`` rows of a contiguous ``x`` ``[..., K]``."""
        n = self.n
        # The sizes as arguments, not one tuple: torch parses them faster (docs/triton-launch.md).
        y = torch.empty(*x.shape[:-1], self.out, dtype=self.dtype, device=self.device)
        x = prepare_x(x)
        tiles = self.n_tiles * -(-m // self.plan.bm)  # not triton.cdiv: microseconds a call on the host
        ws, counters = self.split_k(m, n, tiles)
        self.launch((tiles, self.split, 1), self.w_desc, self.x_desc(x, m), *self.mid, y, ws, counters, m,
                    *self.unrotated)
        return y

    def rotating(self, x: torch.Tensor, m: int) -> torch.Tensor:
        """``y`` ``[m, N]`` of a rotating bucket for the layer's x ``[m, K/passes]``
        (contiguous, this bucket's dtype; the caller checks): x rotated by this launch's
        rotation programs into the kept workspace, which its TMA loads read."""
        y = torch.empty(m, self.out, dtype=self.dtype, device=self.device)
        tiles = self.n_tiles * -(-m // self.plan.bm)
        ws, counters = self.split_k(m, self.n, tiles)
        xr, counts = rotation_buffers(self.device, m * self.k, self.dtype)
        rows = rotation_rows(m, self.groups, tiles)
        self.launch((tiles, rows + self.split, 1), self.w_desc, self.x_desc(xr, m, self.k), *self.mid, y, ws,
                    counters, m, *self.tail, x, self.operand, xr, counts, rows)
        return y


AnyBucket = WgmmaBucket | SmallMBucket | DecodeBucket


def _new_bucket(w: HopperWeights, dtype: torch.dtype, device: torch.device, plan: AnyPlan) -> AnyBucket:
    if isinstance(plan, TritonPlan):
        return SmallMBucket(w, dtype, device, plan)
    if isinstance(plan, DecodePlan):
        return DecodeBucket(w, dtype, device, plan)
    return WgmmaBucket(w, dtype, device, plan)


def bucket_of(x: torch.Tensor, w: HopperWeights, m: int) -> AnyBucket:
    """The bucket of a call of ``m`` rows: one lookup in the state's ``runtime`` (keyed by
    activation dtype, device and M), the weight's buckets (:func:`_bind`) on a miss."""
    bucket = w.runtime.get((x.dtype, x.device, m))
    if bucket is not None and bucket.fits(w):
        return bucket  # type: ignore[no-any-return]
    return _bind(x, w, m)


def _bind(x: torch.Tensor, w: HopperWeights, m: int) -> AnyBucket:
    """The bucket of a call of ``m`` rows from the buckets kept with the packed weight tensor
    (not the state object: the custom op rebuilds the state object around the same tensors
    at every call), bound on a row count's first call, and remembered in ``w.runtime``."""
    state = launch_state(w.qweight)
    key = (x.dtype, x.device)
    runs: dict[int, AnyBucket] | None = state.get(key)
    if runs is None:
        runs = state[key] = {}
    bucket = runs.get(m)
    if bucket is None or not bucket.fits(w):
        plan = _measured_on_first_use(m, w, x, plan_of(m, w, x.device))
        bucket = next((b for b in runs.values() if b.plan == plan and b.fits(w)), None)
        if bucket is None:
            bucket = _new_bucket(w, x.dtype, x.device, plan)
        if len(runs) >= MAX_RUNS:
            runs.clear()
            for seen in [k for k in w.runtime if isinstance(k, tuple) and len(k) == 3 and k[:2] == key]:
                del w.runtime[seen]
        runs[m] = bucket
    w.runtime[(x.dtype, x.device, m)] = bucket
    return bucket


def _measured_on_first_use(m: int, w: HopperWeights, x2: torch.Tensor, plan: AnyPlan) -> AnyPlan:
    """``plan``, or on a card whose own table lacks the shape the fastest of a few timed
    on this weight (``first_use.py``; cached for later processes)."""
    if x2.device.type != "cuda" or isinstance(w, LookupWeights):  # a codebook weight's plans are a rule
        return plan
    card = _card(x2.device)
    shape = Shape(m, w.in_features, w.out_features, w.bits)
    x: list[torch.Tensor] = []

    def run(candidate: Plan) -> None:
        if not x:  # random rows of the call's shape and dtype, made once, only when timing
            x.append(torch.randn(m, w.in_features, device=x2.device).to(x2.dtype))
        linear(x[0], w, fit_stages(candidate, w, card.smem_kib * 1024))

    chosen = first_use_plan(shape, card, plan, run, x2.device)
    return fit_stages(chosen, w, card.smem_kib * 1024) if isinstance(chosen, Plan) else chosen


def linear(x: torch.Tensor, w: HopperWeights, plan: AnyPlan | None = None) -> torch.Tensor:
    """``y = x · Ŵᵀ + b`` ``[..., N]`` for ``x`` ``[..., K]`` with at least one row (already
    permuted by ret_idx); ``plan`` overrides the choice (tests, the probes) and takes
    Triton's own launch path (a Triton plan: its bucket, kept per plan)."""
    m = x.numel() // w.in_features
    if plan is None:
        return bucket_of(x, w, m)(x, w, m)
    if isinstance(plan, TritonPlan | DecodePlan):
        return _plan_bucket(x, w, plan)(x, w, m)
    n = w.out_features
    shape = (*x.shape[:-1], n)
    x = prepare_x(x).reshape(m, -1)
    y = torch.empty(shape, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(n, TILE_N * plan.wg) * triton.cdiv(m, plan.bm)
    slots = stream_grid(w, plan, m, _sms(x.device))[1] if plan.stream else split_steps(w, plan).split
    ws, counters = SplitKBuffers(slots, x.device, w.scales)(m, n, tiles)
    grid, args, const = kernel_args(x, w, plan, y.view(m, n), ws, counters)
    wgmma_kernel[grid](*args, **const)
    return y


def gated_refusal(w: HopperWeights, plan: AnyPlan) -> str:
    """Why a call of ``plan`` over ``w`` cannot end gated ("" where it can)."""
    if isinstance(w, LookupWeights):
        return "a codebook weight (its bias is added after the launch)"
    if w.out_features % (2 * GATED_ROWS):
        return f"N = {w.out_features} is not 2·I with I a multiple of {GATED_ROWS}"
    return gated_plan_refusal(plan)


def gated_linear(x: torch.Tensor, w: HopperWeights, *, fuse: bool = True) -> torch.Tensor:
    """``silu(h[..., :I]) · h[..., I:]`` ``[..., I]`` of ``h = x · Ŵᵀ + b``: one launch, the
    plan a plain call of this M takes with its tiles ending gated (``gluon_split_k.py``),
    where that plan can (:func:`gated_refusal`) and ``fuse`` (the bits of that plan's call
    and ``gated_activation``'s); where it cannot, the table row's gated plan (the bits of
    that plan's call and the activation's: another kernel's rounding, within the layer's
    tolerance); else that plan's launch and ``gated_activation``'s, without a second lookup
    of the plan or a second check of x. ``x`` as :func:`linear` takes it."""
    m = x.numel() // w.in_features
    bucket = bucket_of(x, w, m)
    if fuse:
        twin = bucket.gated
        if twin is None:
            twin = bucket.gated = _gated_twin(bucket, w, m)
        if twin:
            return twin(x, w, m)  # type: ignore[operator, no-any-return]
    return gated_activation(bucket(x, w, m), "silu")


def _gated_twin(bucket: AnyBucket, w: HopperWeights, m: int) -> WgmmaBucket | DecodeBucket | bool:
    """The bucket of ``bucket``'s plan ending gated; where that plan cannot (a Triton plan
    the table found faster), the table's gated plan for the row (:func:`gated_plan_of`): one
    launch costs the host less than the faster plan's and the activation's two."""
    plan: AnyPlan | None = bucket.plan
    if gated_refusal(w, bucket.plan):
        plan = gated_plan_of(m, w, bucket.device)
        if plan is None or gated_refusal(w, plan):
            return False
    if isinstance(plan, DecodePlan):
        return DecodeBucket(w, bucket.dtype, bucket.device, plan, gated=True)
    assert isinstance(plan, Plan)
    return WgmmaBucket(w, bucket.dtype, bucket.device, plan, gated=True)


def _plan_bucket(x2: torch.Tensor, w: HopperWeights, plan: TritonPlan | DecodePlan) -> SmallMBucket | DecodeBucket:
    state = launch_state(w.qweight)
    key = ("plans", x2.dtype, x2.device)
    by_plan: dict[TritonPlan | DecodePlan, SmallMBucket | DecodeBucket] = state.setdefault(key, {})
    bucket = by_plan.get(plan)
    if bucket is None or not bucket.fits(w):
        bucket = by_plan[plan] = _new_bucket(w, x2.dtype, x2.device, plan)  # type: ignore[assignment]
    return bucket
