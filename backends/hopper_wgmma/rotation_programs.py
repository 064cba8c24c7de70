"""A TurboQuant layer's input rotation inside the code matrix's launch (``ROTATE``, in the
decode kernel ``decode.py`` and the wgmma kernel ``kernels.py``): one launch a call where
there were two (x rotated by its own launch, then the code matrix), which saves an H200's
host 10–20 µs of a call's 40–60 (``turboquant_launch.py`` says which calls take it).

The launch's grid gains ``rot_rows`` rows of programs in front along y: grid
``(tiles, rot_rows + split)``. Its programs of the lowest linear ids (x fastest), the first
``chunks = ⌈M/16⌉ · G`` of them, are rotation programs: chunk ``c`` multiplies rows
``16·(c // G)…`` of group ``g = c % G`` of the layer's x, ``[16, d]``, by that group's
rotations side by side, ``[d, P·d]`` (``quantcore/kernels/turboquant/rotation.py``'s
right-hand side: the shared one, or group g's), with ``mma.sync`` in float32, rounds each
value once to x's dtype and stores it where the code matrix reads its inputs
(``[M, G·P·d]``, a kept workspace: ``quantcore/triton/rotation_workspace.py``), then counts
itself in ``sync[0]`` (release). The other programs are the code matrix's, shifted by
``rot_rows``: each issues its first weight loads, waits (acquire) until ``sync[0]`` reads
``chunks``, reads the workspace (the decode kernel with its staging loads; the wgmma
kernel through TMA, after a proxy fence: the stores were the generic proxy's), and counts
itself in ``sync[1]`` once it has read it for the last time; the last of them sets both
counts to 0, so the next launch on the stream (which starts after this one ends, CUDA
graphs included) finds them at 0.

Why it cannot deadlock: a rotation program never waits, and only the code matrix's
programs wait, on programs of lower linear ids. The GPU hands out a grid's blocks in
increasing linear id as resources free up (the assumption single-pass decoupled look-back
scans make; ``backends/turboquant_triton/mma.py``'s rotation once per call makes it too),
so every rotation program is resident, and then finishes, whatever the waiting programs
occupy.

Each value is the dot product of d terms that the rotation's own launch computes
(``rotation_launch.py``: ``tl.dot`` of 16-row tiles, which Triton runs as the same
``mma.sync`` m16n8k16 in the same order of inputs, float32, rounded once): on an H200 the
outputs of the two ways were equal bit for bit in every case measured, and the GPU tests
hold them to it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

__all__ = ["ASYNC_READS", "ROTATION_ROWS", "Rotation", "arrive_rotated", "rotation_chunks", "rotation_constexprs",
           "rotation_program", "rotation_rows", "wait_rotated"]

#: Rows of x one rotation program multiplies: one ``m16n8k16`` row block.
ROWS = 16
ROTATION_ROWS = gl.constexpr(ROWS)
#: :func:`wait_rotated` for a program that reads the rotated x through TMA (the async proxy).
ASYNC_READS = gl.constexpr(True)


def rotation_chunks(m: int, groups: int) -> int:
    """Rotation programs of a launch over ``m`` rows of a layer of ``groups`` groups."""
    return -(-m // ROWS) * groups


def rotation_rows(m: int, groups: int, tiles: int) -> int:
    """Rows of the grid (``tiles`` programs each) that hold a launch's rotation programs."""
    return -(-rotation_chunks(m, groups) // tiles)


class Rotation(NamedTuple):
    """A TurboQuant layer's rotation as the kernels' rotation programs read it
    (:func:`rotate_chunk`): ``source``, the right-hand side ``[R, d, cols]`` in the
    activation dtype (``InputRotation.rhs``; R = 1 when shared), d and cols (= passes · d);
    with ``direct`` the programs load their operands straight into registers and read
    ``operand``, its transpose ``[R, cols, d]`` (else ``operand`` is ``source``)."""

    source: torch.Tensor
    operand: torch.Tensor
    d: int
    cols: int
    shared: bool
    direct: bool

    @classmethod
    def of(cls, rhs: torch.Tensor, d: int, passes: int, shared: bool, direct: bool) -> Rotation:
        return cls(rhs, rhs.transpose(-1, -2).contiguous() if direct else rhs, d, passes * d, shared, direct)


def rotation_constexprs(rotation: Rotation | None) -> dict[str, object]:
    """The kernels' ``ROTATE``, ``RD``, ``RCOLS``, ``RSHARED`` and ``RDIRECT`` for ``rotation`` (or none)."""
    if rotation is None:
        return dict(ROTATE=False, RD=128, RCOLS=128, RSHARED=True, RDIRECT=False)
    return dict(ROTATE=True, RD=rotation.d, RCOLS=rotation.cols, RSHARED=rotation.shared, RDIRECT=rotation.direct)


@gluon.constexpr_function
def _rotation_layout(num_warps):
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, num_warps], instr_shape=[16, 8])


@gluon.jit
def _fence_acq_rel():
    """``fence.acq_rel.gpu`` in every thread: its stores GPU-visible before the count that
    publishes them, or the others' visible to its loads after the count that it read."""
    gl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def rotate_chunk(rx_ptr, rot_ptr, xr_ptr, sync_ptr, chunk, M, K,
                 D: gl.constexpr, COLS: gl.constexpr, SHARED: gl.constexpr, NUM_WARPS: gl.constexpr,
                 DIRECT: gl.constexpr = False):
    """Rotation program ``chunk`` (module docstring). ``rx_ptr``: the layer's x ``[M, K·D/COLS]``
    (contiguous); ``rot_ptr``: ``[R, D, COLS]`` (R = 1 with ``SHARED``, else one per group), or
    with ``DIRECT`` its transpose ``[R, COLS, D]``; ``xr_ptr``: the rotated x ``[M, K]`` (K the
    code matrix's depth, ``G·COLS``).

    Without ``DIRECT`` each step's columns of Π are loaded 16 bytes a thread and moved into
    the MMA's operand registers through shared memory (sm_90a SASS: two barriers per 16 inputs,
    so a step's loads wait for the step before); with it every operand value is loaded
    straight into its register (4 bytes a load, an input pair), no barrier, every step's loads
    in flight at once: the same MMAs in the same order, the same bits."""
    groups = K // COLS
    layer_k = groups * D
    g = chunk % groups
    m0 = (chunk // groups) * 16
    # Output columns a step: one n8 MMA tile a warp (a wider step holds more of Π in registers).
    STEP: gl.constexpr = 8 * NUM_WARPS
    mma_layout: gl.constexpr = _rotation_layout(NUM_WARPS)
    a_layout: gl.constexpr = gl.DotOperandLayout(0, mma_layout, 2)
    b_layout: gl.constexpr = gl.DotOperandLayout(1, mma_layout, 2)
    base = rot_ptr + (0 if SHARED else g * (D * COLS))
    if DIRECT:
        xm = m0 + gl.arange(0, 16, layout=gl.SliceLayout(1, a_layout))
        xk = gl.arange(0, D, layout=gl.SliceLayout(0, a_layout))
        x_rows = gl.expand_dims(xm, 1)
        a = gl.load(rx_ptr + x_rows.to(gl.int64) * layer_k + g * D + gl.expand_dims(xk, 0), mask=x_rows < M,
                    other=0.0)
        rk = gl.arange(0, D, layout=gl.SliceLayout(1, b_layout))
        rc = gl.arange(0, STEP, layout=gl.SliceLayout(0, b_layout))
        rot = base + gl.expand_dims(rk, 1) + gl.expand_dims(rc, 0) * D  # Πᵀ: inputs contiguous
    else:
        load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
        xm = m0 + gl.arange(0, 16, layout=gl.SliceLayout(1, load_layout))
        xk = gl.arange(0, D, layout=gl.SliceLayout(0, load_layout))
        x_rows = gl.expand_dims(xm, 1)
        x = gl.load(rx_ptr + x_rows.to(gl.int64) * layer_k + g * D + gl.expand_dims(xk, 0), mask=x_rows < M,
                    other=0.0)
        a = gl.convert_layout(x, a_layout)
        rk = gl.arange(0, D, layout=gl.SliceLayout(1, load_layout))
        rc = gl.arange(0, STEP, layout=gl.SliceLayout(0, load_layout))
        rot = base + gl.expand_dims(rk, 1) * COLS + gl.expand_dims(rc, 0)

    om = m0 + gl.arange(0, 16, layout=gl.SliceLayout(1, mma_layout))
    oc = gl.arange(0, STEP, layout=gl.SliceLayout(0, mma_layout))
    o_rows = gl.expand_dims(om, 1)
    out = xr_ptr + o_rows.to(gl.int64) * K + g * COLS + gl.expand_dims(oc, 0)
    for c in gl.static_range(COLS // STEP):
        if DIRECT:
            b = gl.load(rot + c * (STEP * D))
        else:
            b = gl.convert_layout(gl.load(rot + c * STEP), b_layout)
        acc = mma_v2(a, b, gl.zeros([16, STEP], gl.float32, mma_layout))
        gl.store(out + c * STEP, acc.to(xr_ptr.dtype.element_ty), mask=o_rows < M)
    _fence_acq_rel()
    gl.thread_barrier()  # every thread's stores are out before the count below
    gl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")


@gluon.jit
def _chunk_count(M, K, COLS: gl.constexpr):
    """Rotation programs of a launch over ``M`` rows of a code matrix of depth ``K``."""
    return gl.cdiv(M, ROTATION_ROWS) * (K // COLS)


@gluon.jit
def rotation_program(rx_ptr, rot_ptr, xr_ptr, sync_ptr, pid_y, M, K,
                     D: gl.constexpr, COLS: gl.constexpr, SHARED: gl.constexpr, NUM_WARPS: gl.constexpr,
                     DIRECT: gl.constexpr):
    """Program ``(program_id(0), pid_y)`` of the rotation rows: chunk ``pid_y · tiles +
    program_id(0)`` (:func:`rotate_chunk`) where there is one; the rest exit."""
    chunk = pid_y * gl.num_programs(0) + gl.program_id(0)
    if chunk < _chunk_count(M, K, COLS):
        rotate_chunk(rx_ptr, rot_ptr, xr_ptr, sync_ptr, chunk, M, K, D, COLS, SHARED, NUM_WARPS, DIRECT)


@gluon.jit
def wait_rotated(sync_ptr, M, K, COLS: gl.constexpr, ASYNC: gl.constexpr = False):
    """Until every rotation program of the launch (over ``M`` rows, depth ``K``) has counted
    itself (acquire); then this program's loads see their stores — with ``ASYNC`` its TMA
    loads too (a proxy fence: the stores were the generic proxy's)."""
    chunks = _chunk_count(M, K, COLS)
    seen = gl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    while seen < chunks:
        seen = gl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    gl.thread_barrier()
    _fence_acq_rel()
    if ASYNC:
        gl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def arrive_rotated(sync_ptr, programs):
    """Count this code-matrix program as done with the rotated x; the last of ``programs``
    sets both counts to 0 for the next launch on the stream."""
    gl.thread_barrier()  # every warp's reads of the workspace are done
    done = gl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if done == programs - 1:
        gl.atomic_xchg(sync_ptr, 0)
        gl.atomic_xchg(sync_ptr + 1, 0)
