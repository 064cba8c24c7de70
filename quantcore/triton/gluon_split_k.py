"""Pieces every Gluon kernel of quantcore's that splits K between programs shares: the end
of a program (its tile stored, or its part put in a workspace slot and, by the tile's last
program, summed in slot order, so the result is the same bits whoever finishes last) and
the programmatic-dependent-launch handshakes (sm_90).

A gated end (``GATED``, for a fused gate/up weight whose N outputs are gate's ``I`` then
up's ``I``) stores ``silu(gate) · up`` ``[M, I]`` instead: every program puts its part in
the workspace, and the last of the two tiles' programs (gate's tile at column ``c`` and
up's at ``I + c``, K split or not) sums both in slot order, rounds each to the output dtype
as the layer's own store would, and applies the activation with the rounding of
``quantcore/kernels/gated_activation/op.py``: the same bits as the layer's call followed by
``gated_activation``'s kernel, in one launch. ``I`` must be a multiple of the tile's rows
(the caller checks)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.extra import libdevice

__all__ = ["let_dependents_launch", "tile_store", "wait_for_prior_grids"]


@gluon.constexpr_function
def store_layout(bn, bm, num_warps):
    # Outputs along N are contiguous in y: 8 per thread, threads along N first.
    tn = min(bn // 8, 32)
    tm = 32 // tn
    wm = max(1, min(num_warps, bm // tm))
    wn = num_warps // wm
    return gl.BlockedLayout([8, 1], [tn, tm], [wn, wm], [0, 1])


@gluon.jit
def wait_for_prior_grids():
    """``griddepcontrol.wait``: until the grids this launch depends on have finished and
    their writes are visible (a no-op for a launch without programmatic dependence)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def let_dependents_launch():
    """``griddepcontrol.launch_dependents``: a launch that depends on this one may start
    its programs (they wait in :func:`wait_for_prior_grids` before reading what this
    one writes)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def tile_store(acc, pid, pid_k, n0, m0, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, split_k,
               SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr,
               NUM_WARPS: gl.constexpr, GATED: gl.constexpr = False):
    """The end of a program of a split (or whole) tile: store it, or its part to workspace
    slot ``pid_k`` of ``split_k``, the last program of the tile (counter ``pid``) summing
    the parts in slot order. ``GATED``: the module docstring's gated end (``y`` is
    ``[M, N/2]``, ``stride_ym`` its row stride; ``pid`` unused)."""
    out_layout: gl.constexpr = store_layout(BN, BM, NUM_WARPS)
    acc = gl.convert_layout(acc, out_layout)
    offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, out_layout))
    offs_m = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, out_layout))
    n_mask = offs_n < N
    mask = gl.expand_dims(n_mask, 1) & gl.expand_dims(offs_m < M, 0)
    y_offs = gl.expand_dims(offs_m.to(gl.int64) * stride_ym, 0) + gl.expand_dims(offs_n, 1)
    out_ty: gl.constexpr = y_ptr.dtype.element_ty
    if GATED:
        _gated_store(acc, pid_k, n0, m0, offs_m, mask, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, split_k,
                     HAS_BIAS, BN, BM, out_layout)
    elif not SPLIT:
        if HAS_BIAS:
            acc += gl.expand_dims(gl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(gl.float32), 1)
        gl.store(y_ptr + y_offs, acc.to(out_ty), mask=mask)
    else:
        ws_offs = gl.expand_dims(offs_m.to(gl.int64) * N, 0) + gl.expand_dims(offs_n, 1)
        gl.store(ws_ptr + pid_k.to(gl.int64) * M * N + ws_offs, acc, mask=mask)
        gl.thread_barrier()  # every thread's partial is stored before the release below
        arrived = gl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == split_k - 1:
            total = gl.zeros([BN, BM], gl.float32, out_layout)
            for s in range(split_k):
                # .cg: from L2, where the other programs' partials are (L1 is not coherent).
                total += gl.load(ws_ptr + s * M * N + ws_offs, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += gl.expand_dims(gl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(gl.float32), 1)
            gl.store(y_ptr + y_offs, total.to(out_ty), mask=mask)
            gl.atomic_xchg(cnt_ptr + pid, 0)  # ready for the next launch


#: Workspace slots the gated end loads at once: the most that leaves the decode kernel its
#: plain end's registers (55 against 56 at 8 rows; 4 slots take 60, a program fewer an SM).
GATED_SLOTS: gl.constexpr = gl.constexpr(3)


@gluon.jit
def _gated_store(acc, pid_k, n0, m0, offs_m, mask, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, split_k,
                 HAS_BIAS: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr, out_layout: gl.constexpr):
    """The gated end (module docstring): this program's part to workspace slot ``pid_k``;
    the last of the pair's ``2 · split_k`` programs stores ``silu(gate) · up``."""
    # I is a multiple of 128 and of the tile's rows (the caller checks): said here, the
    # compiler keeps the pair's loads and stores 16 bytes wide; without it, neither N // 2
    # nor n0 % I has a known alignment and every access goes a scalar at a time.
    inter = gl.multiple_of(N // 2, 128)
    m_rows = gl.expand_dims(offs_m.to(gl.int64) * N, 0)
    rows = gl.arange(0, BN, layout=gl.SliceLayout(1, out_layout))
    gl.store(ws_ptr + pid_k.to(gl.int64) * M * N + m_rows + gl.expand_dims(n0 + rows, 1), acc, mask=mask)
    gl.thread_barrier()  # every thread's partial is stored before the release below
    # The pair's first output column (gate's row; up's is inter further): n0 < 2·inter, so a
    # select, not a remainder (a division by a runtime integer: 16 instructions in sm_90a SASS).
    c0 = gl.multiple_of(gl.where(n0 >= inter, n0 - inter, n0), BN)
    pair = (m0 // BM) * (inter // BN) + c0 // BN
    arrived = gl.atomic_add(cnt_ptr + pair, 1, sem="acq_rel", scope="gpu")
    if arrived == 2 * split_k - 1:
        offs_c = c0 + rows
        c_mask = gl.expand_dims(offs_c < inter, 1) & gl.expand_dims(offs_m < M, 0)
        gate_offs = m_rows + gl.expand_dims(offs_c, 1)
        gate = gl.zeros([BN, BM], gl.float32, out_layout)
        up = gl.zeros([BN, BM], gl.float32, out_layout)
        # GATED_SLOTS slots a trip, their loads issued together (a loop of one slot a trip
        # waits out an L2 round trip per slot, holding the SM); summed in slot order.
        for s0 in range(0, split_k, GATED_SLOTS):
            for j in gl.static_range(GATED_SLOTS):
                s = s0 + j
                live = c_mask & (s < split_k)
                # .cg: from L2, where the other programs' partials are (L1 is not coherent);
                # -0.0 past the last slot: it adds exactly (x + -0.0 is x, -0.0 included).
                slot = ws_ptr + s * M * N + gate_offs
                gate += gl.load(slot, mask=live, other=-0.0, cache_modifier=".cg")
                up += gl.load(slot + inter, mask=live, other=-0.0, cache_modifier=".cg")
        if HAS_BIAS:
            gate += gl.expand_dims(gl.load(b_ptr + offs_c).to(gl.float32), 1)
            up += gl.expand_dims(gl.load(b_ptr + inter + offs_c).to(gl.float32), 1)
        out_ty: gl.constexpr = y_ptr.dtype.element_ty
        # The layer's outputs as its own store rounds them, then the activation and the
        # product in float32, each rounded (gated_activation's contract and operations).
        g = gate.to(out_ty).to(gl.float32)
        u = up.to(out_ty).to(gl.float32)
        a = gl.div_rn(g, 1.0 + libdevice.exp(-g)).to(out_ty)
        y_offs = gl.expand_dims(offs_m.to(gl.int64) * stride_ym, 0) + gl.expand_dims(offs_c, 1)
        gl.store(y_ptr + y_offs, (a.to(gl.float32) * u).to(out_ty), mask=c_mask)
        gl.atomic_xchg(cnt_ptr + pair, 0)  # ready for the next launch
