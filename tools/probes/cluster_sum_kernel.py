"""The split-K sum of a decode tile through a thread-block cluster's shared memory, beside
the sum through global memory the decode kernels use today: an experiment (run it with
``python -m tools.probes.cluster_sum``), not shipped.

A decode kernel that cuts K between programs ends with one fp32 partial a program of its
64 × 8 output tile (64 weight rows, up to 8 activation rows). Today each program stores its
partial to a workspace, takes a ticket (an atomic), and the last one reads every partial
back from L2 and stores the sum (``quantcore/triton/gluon_split_k.tile_store``): on the H100
and the H200 that costs 1.5–3.4 µs of a 15 µs call (``backends/hopper_wgmma/README.md``,
"A warp-level decode kernel"). Here the ``RANKS`` programs of a tile are the CTAs of one
cluster instead (``num_ctas=RANKS``: the program id is the cluster's, ``%cluster_ctarank``
tells the CTAs apart), and their partials meet on chip:

* every CTA stores its partial into its own shared memory, the first 2 KB of the kernel's
  (inline PTX from the window's base, ``global_smem``, after a CTA barrier: whatever the
  kernel kept there before is no longer needed), thread t's four values at ``16·t``; the
  layouts hold the tile whole on every CTA of the cluster (``cga_layout`` of zero vectors);
* one cluster barrier with release/acquire semantics makes the stores visible to the
  cluster;
* CTA 0 reads the other CTAs' partials through distributed shared memory (``mapa`` +
  ``ld.shared::cluster``; Triton 3.6 lowers no cross-CTA exchange of this kind) and adds
  them in rank order: the same fp32 sum, in the same order, as the tickets' last program
  makes, so the two are bit-identical;
* a second cluster barrier keeps every CTA's shared memory alive until CTA 0's remote loads
  are done (release: a relaxed arrive would let a CTA exit under a load still in flight);
  Triton stores a tensor held whole by every CTA from CTA 0 alone.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from quantcore.triton.gluon_split_k import tile_store

__all__ = ["BM", "BN", "cluster_kernel", "cluster_rank", "cluster_sum", "compile_report", "exchange_layout",
           "floor_kernel", "ticket_kernel", "whole"]

#: The decode tile: weight rows (N) by activation rows (M), fp32 partials.
BN, BM = gl.constexpr(64), gl.constexpr(8)


@gluon.constexpr_function
def _exchange_asm(ranks: int) -> str:
    """Inline PTX over one thread's four fp32 values (``$4``–``$7`` in, ``$0``–``$3`` out):
    CTA 0 of the cluster returns the sum over the cluster's ``ranks`` CTAs, the others their
    own values."""
    reads = "".join(
        f"@qc_lead mapa.shared::cluster.u32 qc_peer, qc_addr, {r};\n"
        f"@qc_lead ld.shared::cluster.v4.f32 {{qc_v0, qc_v1, qc_v2, qc_v3}}, [qc_peer];\n"
        + "".join(f"@qc_lead add.f32 ${i}, ${i}, qc_v{i};\n" for i in range(4))
        for r in range(1, ranks))
    return ("{\n"
            ".reg .u32 qc_addr, qc_base, qc_rank, qc_peer;\n"
            ".reg .f32 qc_v<4>;\n"
            ".reg .pred qc_lead;\n"
            "mov.u32 qc_base, global_smem;\n"
            "mov.u32 qc_addr, %tid.x;\n"
            "shl.b32 qc_addr, qc_addr, 4;\n"
            "add.u32 qc_addr, qc_addr, qc_base;\n"
            "mov.u32 qc_rank, %cluster_ctarank;\n"
            "setp.eq.u32 qc_lead, qc_rank, 0;\n"
            + "".join(f"mov.f32 ${i}, ${i + 4};\n" for i in range(4))
            + "bar.sync 0;\n"
            "st.shared.v4.f32 [qc_addr], {$4, $5, $6, $7};\n"
            "barrier.cluster.arrive.release.aligned;\n"
            "barrier.cluster.wait.acquire.aligned;\n"
            + reads
            + "barrier.cluster.arrive.release.aligned;\n"
            "barrier.cluster.wait.acquire.aligned;\n"
            "}")


@gluon.constexpr_function
def whole(ranks, dims):
    """``cga_layout`` bases that hold a tensor of ``dims`` dims whole on every CTA of a
    cluster of ``ranks`` (a power of two; none for one CTA)."""
    return [[0] * dims] * (ranks.bit_length() - 1)


@gluon.constexpr_function
def exchange_layout(ranks):
    """``[64, 8]`` over 4 warps, four consecutive values a thread: thread t holds the 16
    bytes at 16·t of the row-major tile, on every CTA of the cluster."""
    return gl.BlockedLayout([1, 4], [16, 2], [4, 1], [1, 0], cga_layout=whole(ranks, 2))


@gluon.constexpr_function
def _flat_shared(ranks):
    return gl.SwizzledSharedLayout(1, 1, 1, [1, 0], cga_layout=whole(ranks, 2))


@gluon.constexpr_function
def _lanes(ranks):
    # 32 values over a warp's lanes, every warp (and CTA) holding them all: a reduction over
    # them is a few shuffles, no shared memory.
    return gl.BlockedLayout([1], [32], [4], [0], cga_layout=whole(ranks, 1))


@gluon.jit
def cluster_rank(RANKS: gl.constexpr):
    """This CTA's rank in its cluster of ``RANKS``, a scalar (kernels of 4 warps)."""
    probe = gl.arange(0, 32, layout=_lanes(RANKS))
    rank = gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r,r", [probe], dtype=gl.int32,
                                     is_pure=True, pack=1)
    return gl.max(rank, axis=0)


@gluon.jit
def cluster_sum(part, RANKS: gl.constexpr):
    """The sum over the cluster's CTAs of ``part`` (``[64, 8]`` fp32 in
    :func:`exchange_layout`), in rank order, on CTA 0 (the other CTAs get their own part
    back). It takes the first 2 KB of the kernel's shared memory, after a CTA barrier: the
    kernel must own at least that much and need none of it any more."""
    return gl.inline_asm_elementwise(_exchange_asm(RANKS), "=f,=f,=f,=f,f,f,f,f", [part], dtype=gl.float32,
                                     is_pure=False, pack=4)


@gluon.jit
def _tile_offsets(layout: gl.constexpr):
    """Rows, columns and row-major offsets of the ``[BN, BM]`` tile in ``layout``."""
    rows = gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BM, layout=gl.SliceLayout(0, layout))
    return rows, cols, gl.expand_dims(rows, 1) * BM + gl.expand_dims(cols, 0)


@gluon.jit
def cluster_kernel(p_ptr, y_ptr, stride_ym, RANKS: gl.constexpr):
    """Grid ``(tiles,)`` launched with ``num_ctas=RANKS``: the sum over ranks of ``p[tile]``
    (``p``: ``[tiles, RANKS, BN, BM]`` fp32, the stand-in for what each program's walk over
    its share of K leaves in registers) into ``y[m, 64·tile + r]``, through the cluster's
    shared memory."""
    layout: gl.constexpr = exchange_layout(RANKS)
    tile = gl.program_id(0)  # the cluster's id
    rows, cols, offs = _tile_offsets(layout)
    part = gl.load(p_ptr + (tile * RANKS + cluster_rank(RANKS)) * (BN * BM) + offs)
    # The kernel's only shared memory, the 2 KB the exchange takes (kept by its read).
    own = gl.allocate_shared_memory(gl.float32, [BN, BM], _flat_shared(RANKS), part)
    total = cluster_sum(own.load(layout), RANKS)
    y_offs = gl.expand_dims(cols, 0) * stride_ym + gl.expand_dims(tile * BN + rows, 1)
    gl.store(y_ptr + y_offs, total)


@gluon.jit
def ticket_kernel(p_ptr, y_ptr, ws_ptr, cnt_ptr, stride_ym, N, RANKS: gl.constexpr):
    """Grid ``(tiles, RANKS)``: the same sum through the workspace and a ticket a tile, as
    the decode kernels make it today."""
    layout: gl.constexpr = exchange_layout(1)
    tile = gl.program_id(0)
    rank = gl.program_id(1)
    _, _, offs = _tile_offsets(layout)
    part = gl.load(p_ptr + (tile * RANKS + rank) * (BN * BM) + offs)
    tile_store(part, tile, rank, tile * BN, 0, y_ptr, y_ptr, ws_ptr, cnt_ptr, BM, N, stride_ym, RANKS,
                True, False, BN, BM, 4)


@gluon.jit
def floor_kernel(p_ptr, ws_ptr, N, RANKS: gl.constexpr):
    """Grid ``(tiles, RANKS)``: each program loads its partial and stores it to its slot,
    no sum: the launch and traffic both sums are timed against."""
    layout: gl.constexpr = exchange_layout(1)
    tile = gl.program_id(0)
    rank = gl.program_id(1)
    rows, cols, offs = _tile_offsets(layout)
    part = gl.load(p_ptr + (tile * RANKS + rank) * (BN * BM) + offs)
    y_offs = gl.expand_dims(cols, 0) * N + gl.expand_dims(tile * BN + rows, 1)
    gl.store(ws_ptr + rank * BM * N + y_offs, part)


def compile_report(ranks: int = 4) -> dict[str, object]:
    """The cluster kernel compiled for sm_90a on any machine: registers, shared memory, the
    cluster it asks for, and the SASS it relies on (the barriers, the remote loads, the
    store's address, CTA 0 alone storing)."""
    from quantcore.triton.compile_report import compile_sm90, instructions, opcode_counts

    compiled = compile_sm90(cluster_kernel, {"p_ptr": "*fp32", "y_ptr": "*fp32", "stride_ym": "i32"},
                            {"RANKS": ranks}, divisible=["p_ptr", "y_ptr", "stride_ym"],
                            options={"num_warps": 4, "num_ctas": ranks}, gluon=True)
    ins = instructions(compiled.sass)
    ptx = compiled.asm["ptx"]
    return {"ranks": ranks, "registers": compiled.registers, "spill_stack": compiled.spill_stack,
            "shared": compiled.shared, "cluster": f".reqnctapercluster {ranks}" in ptx,
            "opcodes": dict(opcode_counts(i.opcode for i in ins)), "sass": compiled.sass}
