"""The tensor-core kernel (small and middle M): unpack, lookup, ``tl.dot`` and rescale of
every pass in one launch, split over K.

Grid ``(N / BLOCK_N, SPLIT, M / BLOCK_M)``. Program (j, s, i) accumulates the output tile
``acc[BLOCK_N, BLOCK_M]`` of weight rows j·BLOCK_N… and activation rows i·BLOCK_M… over
the groups ``[s·GPC, (s+1)·GPC)``. Per group and pass:

* the group's index words [BLOCK_N, d/8] are looked up in the shared-memory codebook
  (``lookup.nibble_values``) and the eight planes interleaved back to the natural
  coordinate order, [BLOCK_N, d], in the dot dtype;
* ``tl.dot(Ŵ_g, x_rot_gᵀ)`` with the weight as the left operand, so a decode-sized batch
  needs no padding to the matrix unit's row count;
* the (row, group) scale multiplies that group's [BLOCK_N, BLOCK_M] result — once per
  output element and group, not once per weight element. With ``SCALED``
  (``MmaConfig.scaled_operand``, register operand only) it multiplies the operand
  instead, ŵ = centroid · scale rounded once to x's dtype, and the dot accumulates into
  the running tile (``tl.dot(Ŵ_g, x_rot_gᵀ, acc)``): no multiply of a group's result
  waits for its MMAs.

Where ``x_rot`` comes from (the constexpr ``ROTATE``):

* ``ROTATE`` (the default for a rotation shared by every group, R = 1, in 16 bits on a
  GPU): each program rotates the x columns of the groups it owns itself, as the decode
  kernel does (``gemv.py``) — per group and distinct rotation one ``tl.dot(Πᵀ, x_gᵀ)``
  ([d, d]·[d, BLOCK_M], float32 accumulation, rounded to the rotation's dtype as the
  outside GEMM rounds its result), Πᵀ loaded once per program before the group loop and
  kept in shared memory. x is read as it came, [M, K]; the call is this one launch. It
  costs d/BLOCK_N more matrix-unit work per group (each of the N/BLOCK_N programs that
  share an x tile rotates it again) and d² rotation values read from L2 per program;
* otherwise x is rotated once per call by one small GEMM outside
  (``quantcore/kernels/turboquant/rotation.py``): [M, G, X_COPIES, d], group g of pass p
  at ``(g·X_COPIES + p)·d`` of row m. A rotation per group (R = G) is always applied
  there: in the kernel each program would read d² values per group, and the pipeliner
  would keep one per stage in shared memory (over 227 KB with two passes at d = 128); so
  is a float32 rotation on a GPU (``configs.rotate_in_kernel``).

* ``ROTATE_ONCE`` (a shared 16-bit rotation, asked for: ``configs.mma_rotation``): x is
  rotated once per call inside this launch. The grid gains ``rotating`` z-slices in front,
  ``(N/BLOCK_N, SPLIT, rotating + M/BLOCK_M)``: the programs of those slices (the lowest
  linear ids, x fastest) are rotation programs, the first R = X_COPIES · G · M/BLOCK_M of
  them each rotating one (rotation, group, row tile) chunk of x as ``ROTATE`` does and
  storing it into a workspace in the outside GEMM's layout (the rest exit); the other
  slices are the output tiles, which read that workspace as they would read the outside
  GEMM's result. Two int32 counts (``sync_ptr``) join them: each rotation program adds 1
  to the first with release semantics after its stores; an output tile spins (acquire)
  until it reads R before its first read of the workspace, and adds 1 to the second
  after its last; the tile that brings the second to the number of tiles sets both to 0,
  so the next launch on the stream (which starts after this one ends, CUDA graphs
  included) finds them at 0 with no memset.

  Why it cannot deadlock: a rotation program never waits, and only output tiles spin, on
  work of programs with lower linear ids. The GPU hands out a grid's blocks in increasing
  linear id as resources free up (the assumption single-pass decoupled look-back scans
  make), so every rotation program is resident, and then finishes, whatever the spinning
  tiles occupy. The interpreter runs a grid x-major, not in linear order: there the grid
  is one-dimensional in linear order (:func:`_slice_id`), and as programs run one after
  another every chunk is in before the first tile reads; a count other than R (not reset
  by the previous launch) makes that tile NaN.

X_COPIES = 2 when the passes have their own rotations, 1 when one rotation serves every
pass (then one rotated copy of each group serves both).

With SPLIT > 1 the split partials meet as in the decode kernel (``gemv.py``): a float32
workspace and a ticket per output tile; the last program adds them in split order.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantcore.triton.interpreter import serialize_launches

from .gemv import _release
from .lookup import codebook_table, group_centroids, rounded, to_output
from .operand import operand_order, operand_position, register_operand

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["mma_kernel"]


@triton.jit
def _rotation_t(rot_ptr, D: tl.constexpr, REG_OPERAND: tl.constexpr):
    """Πᵀ of the shared rotation ([1, d, d] at ``rot_ptr``): [D, D], (i, j) = Π[j, c(i)],
    c(i) = i, or with ``REG_OPERAND`` the coordinate at position i of the register
    operand's order (``operand.py``), so that Πᵀ x comes out in that order."""
    dd = tl.arange(0, D)
    return tl.load(rot_ptr + dd[None, :] * D + operand_order(dd, D, REG_OPERAND)[:, None])


@triton.jit
def _x_t(x_ptr, offs_m, m_mask, row_stride, col0, D: tl.constexpr):
    """[D, BLOCK_M]: the d columns at ``col0`` of rows ``offs_m`` (rows past M and masked
    groups read 0)."""
    dd = tl.arange(0, D)
    return tl.load(x_ptr + offs_m[None, :].to(tl.int64) * row_stride + col0 + dd[:, None], mask=m_mask[None, :],
                   other=0.0)


@triton.jit
def _cast(v, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """fp32 ``v`` in ``dtype``, rounded to nearest even (see :func:`_rotated_t`)."""
    return rounded(v, dtype) if INTERPRET else v.to(dtype)


@triton.jit
def _rotated_t(pt, xt, DOT_FP32: tl.constexpr, INTERPRET: tl.constexpr):
    """x_rot_gᵀ = Πᵀ x_gᵀ, [D, BLOCK_M] in Π's dtype: the d-term dot products the outside
    GEMM computes (x cast to Π's dtype, float32 accumulation, one rounding to nearest even:
    ``cvt.rn`` on the GPU, on the bits under the interpreter, whose own conversion to bf16
    truncates)."""
    if xt.dtype != pt.dtype:
        xt = _cast(xt.to(tl.float32), pt.dtype, INTERPRET)
    if DOT_FP32:
        r = tl.dot(pt.to(tl.float32), xt.to(tl.float32), input_precision="ieee")
    else:
        r = tl.dot(pt, xt)
    return _cast(r, pt.dtype, INTERPRET)


@triton.jit
def _group_product(acc, idx_ptr, scale_ptr, xt, rows, rmask, g, stride_idx, cb_ptr, N_GROUPS: tl.constexpr,
                   D: tl.constexpr, BLOCK_N: tl.constexpr, REG_OPERAND: tl.constexpr, SCALED: tl.constexpr,
                   DOT_FP32: tl.constexpr, INTERPRET: tl.constexpr):
    """``acc`` + scale[:, g] · (Ŵ_g x_rot_gᵀ): [BLOCK_N, BLOCK_M] fp32, ``xt`` = x_rot_gᵀ
    [D, BLOCK_M] (with ``REG_OPERAND`` its rows in the register operand's coordinate
    order). With ``SCALED`` (register operand only) the scale is in the operand instead,
    ŵ = centroid · scale rounded once to x's dtype, and the dot accumulates into ``acc``
    itself: nothing multiplies its result, so nothing waits for it in this iteration."""
    if SCALED:
        s = tl.load(scale_ptr + rows.to(tl.int64) * N_GROUPS + g, mask=rmask, other=0.0)
        w_hat = register_operand(idx_ptr, rows, rmask, g, stride_idx, cb_ptr, s[:, None], xt.dtype, D, BLOCK_N,
                                 True, DOT_FP32, INTERPRET)
        if DOT_FP32:
            return tl.dot(w_hat, xt.to(tl.float32), acc, input_precision="ieee")
        return tl.dot(w_hat, xt, acc)
    if REG_OPERAND:
        w_hat = register_operand(idx_ptr, rows, rmask, g, stride_idx, cb_ptr, 0.0, xt.dtype, D, BLOCK_N, False,
                                 DOT_FP32, INTERPRET)
    else:
        w_hat = group_centroids(idx_ptr, rows, rmask, g, stride_idx, cb_ptr, D // 8, D, BLOCK_N, INTERPRET)
    if DOT_FP32:
        part = tl.dot(w_hat, xt.to(tl.float32), input_precision="ieee")
    else:
        part = tl.dot(w_hat.to(xt.dtype), xt)
    s = tl.load(scale_ptr + rows.to(tl.int64) * N_GROUPS + g, mask=rmask, other=0.0)
    return acc + part * s[:, None]


@triton.jit
def _rotate_chunk(x_ptr, rot_ptr, rot2_ptr, xr_ptr, sync_ptr, chunk, M, N_GROUPS: tl.constexpr, D: tl.constexpr,
                  BLOCK_M: tl.constexpr, X_COPIES: tl.constexpr, REG_OPERAND: tl.constexpr, DOT_FP32: tl.constexpr,
                  INTERPRET: tl.constexpr):
    """Rotation program ``chunk`` of a ``ROTATE_ONCE`` launch: rotation p of group g of the
    row tile i (chunk = (i·N_GROUPS + g)·X_COPIES + p) — :func:`_rotated_t`, as the
    in-kernel rotation computes it — stored where the rotation GEMM outside puts it
    (``[M, G, X_COPIES, d]``; with ``REG_OPERAND`` each group in the register operand's
    order, ``operand.coordinate_order``), then counted in ``sync_ptr[0]`` with release
    semantics."""
    K: tl.constexpr = N_GROUPS * D
    p = chunk % X_COPIES
    g = (chunk // X_COPIES) % N_GROUPS
    offs_m = (chunk // (X_COPIES * N_GROUPS)) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    xg = _x_t(x_ptr, offs_m, m_mask, K, g * D, D)
    # The pointer is chosen, not the loaded Π (a branch yielding Π kept it in registers).
    pt = _rotation_t(tl.where(p == 0, rot_ptr, rot2_ptr) if X_COPIES == 2 else rot_ptr, D, False)
    xt = _rotated_t(pt, xg, DOT_FP32, INTERPRET)
    dd = tl.arange(0, D)
    if REG_OPERAND:  # coordinate c at its position in the register operand's order
        dd = operand_position(dd, D)
    tl.store(xr_ptr + offs_m[None, :].to(tl.int64) * (X_COPIES * K) + (g * X_COPIES + p) * D + dd[:, None], xt,
             mask=m_mask[None, :])
    # Every thread's stores GPU-visible, then one release (the split-K tickets' pattern).
    _release(INTERPRET)
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait_rotated(sync_ptr, chunks, INTERPRET: tl.constexpr):
    """Wait until all ``chunks`` rotation programs have counted themselves in
    ``sync_ptr[0]`` (acquire), then order this program's later loads after theirs.
    Returns whether the count was exactly ``chunks`` — always on the GPU; under the
    interpreter, which runs programs one after another in id order, the rotation
    programs (the lowest ids) have all run, so there is nothing to wait for and anything
    else (a count not reset by the previous launch, a chunk not run) is a bug the caller
    makes visible."""
    seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    if not INTERPRET:
        while seen < chunks:
            seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        _release(INTERPRET)
    return seen == chunks


@triton.jit
def _arrive(sync_ptr, tiles):
    """Count this output tile in ``sync_ptr[1]`` once it has read the rotated x for the
    last time; the last of ``tiles`` to arrive sets both counts to 0 for the next launch
    on this stream (which starts after this one ends)."""
    done = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if done == tiles - 1:
        tl.atomic_xchg(sync_ptr, 0)
        tl.atomic_xchg(sync_ptr + 1, 0)


@triton.jit
def _output_tile(
    x_ptr, idx_ptr, scale_ptr, rot_ptr, idx2_ptr, scale2_ptr, rot2_ptr,
    cb_ptr, out_ptr, partial_ptr, bias_ptr, ws_ptr, ticket_ptr,
    M, N, stride_idx, stride_idx2, pid_n, split, pid_m, tiles_n, rotated,
    N_GROUPS: tl.constexpr, D: tl.constexpr, GPC: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, TWO_PASSES: tl.constexpr, X_COPIES: tl.constexpr,
    ROTATE: tl.constexpr, ROTATE_ONCE: tl.constexpr, REG_OPERAND: tl.constexpr, SCALED: tl.constexpr,
    HAS_PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_FP32: tl.constexpr, INTERPRET: tl.constexpr,
):
    """The output tile (pid_n, pid_m) over the groups of ``split`` (module docstring);
    ``x_ptr`` is x as it came with ``ROTATE``, else x rotated ([M, G, X_COPIES, d]);
    ``rotated``: what :func:`_wait_rotated` returned (``ROTATE_ONCE`` only)."""
    K: tl.constexpr = N_GROUPS * D
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    codebook_table(cb_ptr, INTERPRET)
    tl.debug_barrier()
    if ROTATE:  # one Πᵀ per rotation for every group: loaded once, kept in shared memory
        pt = _rotation_t(rot_ptr, D, REG_OPERAND)
        if X_COPIES == 2:
            pt2 = _rotation_t(rot2_ptr, D, REG_OPERAND)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for i in range(0, GPC):
        # No branch on the last split's missing groups (it would stop the pipeliner):
        # their loads are masked, so their scale and activations are zero.
        g = split * GPC + i
        g_ok = g < N_GROUPS
        if ROTATE:
            xg = _x_t(x_ptr, offs_m, m_mask & g_ok, K, g * D, D)
            xt = _rotated_t(pt, xg, DOT_FP32, INTERPRET)
        else:
            xt = _x_t(x_ptr, offs_m, m_mask & g_ok, X_COPIES * K, g * (X_COPIES * D), D)
        acc = _group_product(acc, idx_ptr, scale_ptr, xt, rows, rmask & g_ok, g, stride_idx, cb_ptr, N_GROUPS, D,
                             BLOCK_N, REG_OPERAND, SCALED, DOT_FP32, INTERPRET)
        if TWO_PASSES:
            if X_COPIES == 2:  # pass 2's own rotation of the group
                if ROTATE:
                    xt = _rotated_t(pt2, xg, DOT_FP32, INTERPRET)
                else:  # its copy follows pass 1's
                    xt = _x_t(x_ptr, offs_m, m_mask & g_ok, 2 * K, g * (2 * D) + D, D)
            acc = _group_product(acc, idx2_ptr, scale2_ptr, xt, rows, rmask & g_ok, g, stride_idx2, cb_ptr,
                                 N_GROUPS, D, BLOCK_N, REG_OPERAND, SCALED, DOT_FP32, INTERPRET)
    if ROTATE_ONCE and INTERPRET:  # a count other than every chunk's: make the result NaN, never stale
        acc += tl.where(rotated, 0.0, float("nan"))
    out_offs = offs_m[None, :].to(tl.int64) * N + rows[:, None]
    mask = rmask[:, None] & m_mask[None, :]
    if SPLIT == 1:
        if HAS_PARTIAL:
            acc += tl.load(partial_ptr + out_offs, mask=mask, other=0.0)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rows, mask=rmask, other=0.0)[:, None]
        tl.store(out_ptr + out_offs, to_output(acc, out_ptr), mask=mask)
    else:
        tile = pid_m * tiles_n + pid_n
        tl.store(ws_ptr + split * M * N + out_offs, acc, mask=mask)
        _release(INTERPRET)
        tl.debug_barrier()
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for sp in range(0, SPLIT):
                total += tl.load(ws_ptr + sp * M * N + out_offs, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_PARTIAL:
                total += tl.load(partial_ptr + out_offs, mask=mask, other=0.0)
            if HAS_BIAS:
                total += tl.load(bias_ptr + rows, mask=rmask, other=0.0)[:, None]
            tl.store(out_ptr + out_offs, to_output(total, out_ptr), mask=mask)
            tl.atomic_xchg(ticket_ptr + tile, 0)


@triton.jit
def _slice_id(N, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, INTERPRET: tl.constexpr):
    """z of this program in the ``ROTATE_ONCE`` grid ``(N/BLOCK_N, SPLIT, rotating +
    M/BLOCK_M)``. The interpreter runs a grid x-major, not in linear id order (x fastest):
    there the grid is one-dimensional, in linear order, and the ids are derived from it."""
    if INTERPRET:
        return tl.program_id(0) // (tl.cdiv(N, BLOCK_N) * SPLIT)
    else:
        return tl.program_id(2)


@triton.jit
def _linear_id(INTERPRET: tl.constexpr):
    """This program's linear id in the grid (x fastest, then y, then z)."""
    if INTERPRET:
        return tl.program_id(0)
    else:
        return (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) + tl.program_id(0)


@triton.jit
def _tile_xy(N, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, INTERPRET: tl.constexpr):
    """``(x, y, X)`` of this program in the ``ROTATE_ONCE`` grid (:func:`_slice_id`). On the
    GPU the program ids themselves, read where the output tile starts: the compiler then
    reads them again where it needs them instead of holding them in registers across the
    group loop (read before the branch on the slice, they cost up to 20 registers a
    thread on sm_90a)."""
    if INTERPRET:
        nx = tl.cdiv(N, BLOCK_N)
        return tl.program_id(0) % nx, (tl.program_id(0) // nx) % SPLIT, nx
    else:
        return tl.program_id(0), tl.program_id(1), tl.num_programs(0)


@triton.jit
def mma_kernel(
    x_ptr, idx_ptr, scale_ptr, rot_ptr, idx2_ptr, scale2_ptr, rot2_ptr,
    cb_ptr, out_ptr, partial_ptr, bias_ptr, ws_ptr, ticket_ptr, xr_ptr, sync_ptr,
    M, N, stride_idx, stride_idx2, rotating,
    N_GROUPS: tl.constexpr, D: tl.constexpr, GPC: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, TWO_PASSES: tl.constexpr, X_COPIES: tl.constexpr,
    ROTATE: tl.constexpr, ROTATE_ONCE: tl.constexpr, REG_OPERAND: tl.constexpr, SCALED: tl.constexpr,
    HAS_PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_FP32: tl.constexpr, INTERPRET: tl.constexpr,
):
    if ROTATE_ONCE:  # the first ``rotating`` z-slices hold the rotation programs, the others the output tiles
        chunks = X_COPIES * N_GROUPS * tl.cdiv(M, BLOCK_M)
        pid_z = _slice_id(N, BLOCK_N, SPLIT, INTERPRET)
        if pid_z < rotating:
            chunk = _linear_id(INTERPRET)
            if chunk < chunks:
                _rotate_chunk(x_ptr, rot_ptr, rot2_ptr, xr_ptr, sync_ptr, chunk, M, N_GROUPS, D, BLOCK_M, X_COPIES,
                              REG_OPERAND, DOT_FP32, INTERPRET)
        else:
            rotated = _wait_rotated(sync_ptr, chunks, INTERPRET)
            pid_n, split, tiles_n = _tile_xy(N, BLOCK_N, SPLIT, INTERPRET)
            _output_tile(xr_ptr, idx_ptr, scale_ptr, rot_ptr, idx2_ptr, scale2_ptr, rot2_ptr, cb_ptr, out_ptr,
                         partial_ptr, bias_ptr, ws_ptr, ticket_ptr, M, N, stride_idx, stride_idx2,
                         pid_n, split, pid_z - rotating, tiles_n, rotated,
                         N_GROUPS, D, GPC, SPLIT, BLOCK_N, BLOCK_M, TWO_PASSES, X_COPIES, False, True, REG_OPERAND,
                         SCALED, HAS_PARTIAL, HAS_BIAS, DOT_FP32, INTERPRET)
            _arrive(sync_ptr, tiles_n * SPLIT * tl.cdiv(M, BLOCK_M))
    else:
        _output_tile(x_ptr, idx_ptr, scale_ptr, rot_ptr, idx2_ptr, scale2_ptr, rot2_ptr, cb_ptr, out_ptr,
                     partial_ptr, bias_ptr, ws_ptr, ticket_ptr, M, N, stride_idx, stride_idx2,
                     tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(0), True,
                     N_GROUPS, D, GPC, SPLIT, BLOCK_N, BLOCK_M, TWO_PASSES, X_COPIES, ROTATE, False, REG_OPERAND,
                     SCALED, HAS_PARTIAL, HAS_BIAS, DOT_FP32, INTERPRET)
