"""The Triton grouped W8A16 GEMM over TensorRT-LLM's preprocessed MoE weight layout.

Imported only when the Triton kernel runs (it imports triton).

**The layout, read as 32-bit words.** Per expert (int8, SM 75–90 and the MoE path on
SM 90; see ``preprocess``), byte ``(n // 2)·2K + (p // 64)·128 + (n % 2)·64 + p % 64``
holds the biased code ``u = q + 128`` of column n at stored position p; stored position
``16i + j`` of a 16-row block holds logical row ``16i + σ(j)``, σ = 0 8 1 9 2 10 3 11 …
(the LDSM row permutation composed with the register byte swap). So the 32-bit word
``c`` (0..3) of a 16-row block holds, in its bytes 0, 1, 2, 3, the rows
``2c, 2c + 8, 2c + 1, 2c + 9`` — exactly the four K values one thread of an MMA
fragment holds (rows ``2c, 2c + 1`` in one register, ``2c + 8, 2c + 9`` in the other).
That is what the layout was made for, and it is how this kernel reads it: one 32-bit
word per thread, bytes 0 and 2 become the pair for k ``16i + 2c + (0, 1)``, bytes 1 and
3 the pair for ``16i + 8 + 2c + (0, 1)``; joined, permuted and reshaped (free in
registers: Triton maps the result onto the wgmma operand layout without moving data)
they are the weight tile in *logical* K order. The activations are read as they are,
contiguous rows, no permutation.

**Codes to floats** without the integer-to-float unit (TensorRT-LLM's own trick):
``0x4B000000 | u`` is the float32 ``2²³ + u`` (one PRMT per byte through inline PTX on
the GPU; shifts and masks under the interpreter). Dequantization folds into one FMA:
``w = (2²³ + u)·s − (2²³ + 128)·s = q·s``, exact in float32 when the constant
``(2²³ + 128)·s`` is, which holds for a bf16 scale (8-bit significand: 17 + 8 bits fit
in 24) — ``EXACT_FMA``; fp16 scales (11 bits) take a subtract and a multiply instead.
Zeros add once more. ``PRE_SCALE`` rounds ``w`` to the activation dtype and lets the
tensor cores accumulate across K-tiles (TensorRT-LLM's numerics); without it the exact
codes go into the dot and each K-tile's partial sum is scaled (one K-tile never spans
two groups).

**Routes.** A route is one (token, slot); the expert of route r is ``ids[r]`` and its
activation row ``r // x_div``. Two ways to give a program its routes:

- ``SCHEDULED = False`` (decode): program (d, n-tile) takes the d-th distinct expert of
  the call, found in the kernel from all ``R ≤ R_PAD`` ids, and compacts that expert's
  routes into blocks of ``BM`` itself. One launch, nothing before it.
- ``SCHEDULED = True`` (prefill): a tile scheduler over (expert, M-tile, N-tile); the
  tiles, ordered expert, N-tile, M-tile (the M-tiles that share a weight tile run side by
  side and read it once from HBM), go one to a program, or ``PERSISTENT`` programs walk
  them ``PROGS`` apart (a run-time loop bound: not under the interpreter).
  ``SPLIT_TAIL`` runs an expert's last M-tile of at most ``BM / 2`` routes at half width.
  Each program derives its tile from the ids (one launch): :func:`_key_counts` counts the
  routes per expert, their tiles' scan gives the program its expert and M-tile, and
  :func:`_window_routes` finds that M-tile's routes in route order. Or, with
  ``SCHEDULE_KERNEL``, one small kernel launched first (:func:`route_schedule_kernel`)
  counting-sorts the routes by expert and writes each expert's first sorted position and
  first tile, and the programs read them. Both give an M-tile the same routes in the same
  slots, so the same outputs bit for bit. ``X_SORTED`` (with the scheduling kernel) reads
  the activations from a copy already permuted into sorted order (contiguous rows)
  instead of gathering rows by route inside the loads (measured slower on the H100: kept
  as a variant).

**Stray ids.** An expert id outside ``[0, E)`` (any int32 or int64 value) is never used
as an address: :func:`_route_experts` maps every such id to the key ``E``, the routes of
that key form one more group after the experts (a program of its own in-kernel, a run
of tiles after the last expert's when scheduled), and that group's tiles give NaN rows
without reading a weight (:func:`_expert_tile`). So a bad id gives a loud result, not an
out-of-bounds access or a plausible wrong number, and the host never has to read the
ids to check them.

**GATED** fuses TensorRT-LLM's SwiGLU (``h[:I] · SiLU(h[I:])``): a tile's rows are 8
linear-half columns then the same 8 gate-half columns, repeated, so each thread holds a
column's two halves in the rows ``r`` and ``r + 8`` of its accumulator fragment.

K is a compile-time constant: a loop bound read from a run-time scalar breaks Triton
3.6's interpreter under NumPy 2.4, and a model has few distinct K.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantcore.triton.interpreter import serialize_launches

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["MAGIC", "moe_w8a16_kernel", "route_schedule_kernel", "schedule_words", "word_codes"]

#: 2²³ + 128: the float32 ``0x4B000000 | u`` minus this is the signed code q.
MAGIC = 8388736.0


def schedule_words(routes: int, experts: int, tokens: bool) -> int:
    """int32 words of the buffer :func:`route_schedule_kernel` writes and the scheduled
    GEMM reads: ``starts [E + 2]``, ``tiles [E + 2]``, ``sorted [R]``, then ``tokens [R]``
    when they are written (one allocation a call, its parts found by offset)."""
    return 2 * (experts + 2) + routes * (2 if tokens else 1)


@triton.jit
def _route_experts(ids_ptr, offs, R, E):
    """The expert of routes ``offs`` as an int32 key: the id where it lies in ``[0, E)``,
    ``E`` for any other id (a stray route, whatever its value or dtype), ``-1`` past the
    ``R`` routes. Every use of an id in these kernels goes through this key."""
    live = offs < R
    ids = tl.load(ids_ptr + offs, mask=live, other=0)
    # one unsigned comparison: a negative id, read unsigned, is larger than any E
    if ids.dtype == tl.int64:
        inside = ids.to(tl.uint64, bitcast=True) < E.to(tl.uint64)
    else:
        inside = ids.to(tl.uint32, bitcast=True) < E.to(tl.uint32)
    key = tl.where(inside, ids, E)
    return tl.where(live, key, -1).to(tl.int32)


@triton.jit
def word_codes(words, ASM: tl.constexpr):
    """The four biased bytes of each 32-bit word as float32 ``2²³ + u``."""
    if ASM:
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 m;
            mov.b32 m, 0x4B000000;
            prmt.b32 $0, $4, m, 0x7540;
            prmt.b32 $1, $4, m, 0x7541;
            prmt.b32 $2, $4, m, 0x7542;
            prmt.b32 $3, $4, m, 0x7543;
            }""",
            constraints="=r,=r,=r,=r,r",
            args=[words],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )
    b0 = ((words & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True)
    b1 = (((words >> 8) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True)
    b2 = (((words >> 16) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True)
    b3 = (((words >> 24) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True)
    return b0, b1, b2, b3


@triton.jit
def _dequant(b, s, c, z, SYM: tl.constexpr, PRE_SCALE: tl.constexpr, EXACT_FMA: tl.constexpr):
    if not PRE_SCALE:
        return b - 8388736.0  # the exact code q
    if EXACT_FMA:  # noqa: SIM108 (constexpr branches read better as blocks)
        w = tl.fma(b, s[:, None], c[:, None])
    else:
        w = (b - 8388736.0) * s[:, None]
    if not SYM:
        w += z[:, None]
    return w


@triton.jit
def _unpair(words, BN: tl.constexpr, DTYPE: tl.constexpr):
    """``[BN/2]`` 32-bit words, each two adjacent 16-bit scales → ``[BN]`` float32."""
    if DTYPE == tl.bfloat16:  # noqa: SIM300 (a bf16 is the upper half of its float32)
        lo = (words << 16).to(tl.float32, bitcast=True)
        hi = (words & -65536).to(tl.float32, bitcast=True)
    else:
        lo = (words & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (words >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return tl.join(lo, hi).reshape(BN)


@triton.jit
def _logical_tile(b0, b1, b2, b3, BN: tl.constexpr, BK: tl.constexpr):
    """``[BN, BK/4]`` words' bytes → the ``[BN, BK]`` tile in logical K order."""
    lo = tl.join(b0, b2).reshape(BN, BK // 16, 8)  # k = 16i + 2c + (0, 1)
    hi = tl.join(b1, b3).reshape(BN, BK // 16, 8)  # k = 16i + 8 + 2c + (0, 1)
    return tl.join(lo, hi).permute(0, 1, 3, 2).reshape(BN, BK)


@triton.jit
def _expert_tile(
    x_ptr, x_rows, m_ok,
    w_ptr, s_ptr, z_ptr, e, E, cols, n_ok, N, G,
    K: tl.constexpr, GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    SYM: tl.constexpr, PRE_SCALE: tl.constexpr, EXACT_FMA: tl.constexpr, ASM: tl.constexpr,
    FP32_DOT: tl.constexpr, SCALE_PAIRS: tl.constexpr,
):
    """``acc[BN, BM] = W[e][:, cols]ᵀ · x[rows]ᵀ`` in float32, the weight tile
    dequantized in registers as the dot's left operand. For the stray key ``e == E``, NaN:
    the same code runs with every weight and scale load masked off (at expert ``E - 1``'s
    addresses, never touched) and the accumulator starting at NaN. Not a branch around
    the K-loop: on sm_90 such a branch makes ptxas build the loop's wgmma descriptors in
    per-thread registers, 10 % more instructions a K-step in the decode tile (README.md
    here, "Expert ids outside [0, E)")."""
    WORDS: tl.constexpr = BK // 4
    expert = e < E
    n_ok = n_ok & expert
    e64 = tl.minimum(e, E - 1).to(tl.int64)
    # word (w, n) of an expert: (n // 2)·K/2 + (w // 16)·32 + (n % 2)·16 + w % 16
    w_base = w_ptr + e64 * (K // 4) * N
    offs_w = tl.arange(0, WORDS)
    w_tile = w_base + ((cols // 2) * (K // 2) + (cols % 2) * 16)[:, None] + ((offs_w // 16) * 32 + offs_w % 16)[None, :]
    offs_k = tl.arange(0, BK)
    x_tile = x_ptr + x_rows[None, :] + offs_k[:, None]
    if SCALE_PAIRS:
        # Scales (and zeros) read as 32-bit pairs of adjacent columns: 4-byte loads go
        # through the pipelined asynchronous copies, 2-byte ones would stall every warp.
        pair_cols = tl.split(cols.reshape(BN // 2, 2))[0]
        sz = s_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + (e64 * G * N + pair_cols) // 2
        zz = z_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + (e64 * G * N + pair_cols) // 2
        pair_ok = tl.split(n_ok.reshape(BN // 2, 2))[0]
    else:
        sz = s_ptr + e64 * G * N + cols
        zz = z_ptr + e64 * G * N + cols
    acc = tl.full((BN, BM), tl.where(expert, 0.0, float("nan")), tl.float32)
    for k0 in range(0, K, BK):
        g = (k0 // GROUP) * N
        if SCALE_PAIRS:
            s = _unpair(tl.load(sz + g // 2, mask=pair_ok, other=0), BN, s_ptr.dtype.element_ty)
            z = s
            if not SYM:
                z = _unpair(tl.load(zz + g // 2, mask=pair_ok, other=0), BN, s_ptr.dtype.element_ty)
        else:
            s = tl.load(sz + g, mask=n_ok, other=0.0).to(tl.float32)
            z = s
            if not SYM:
                z = tl.load(zz + g, mask=n_ok, other=0.0).to(tl.float32)
        words = tl.load(w_tile + k0 // 2, mask=n_ok[:, None], other=0)
        xt = tl.load(x_tile + k0, mask=m_ok[None, :], other=0.0)
        c = s * -8388736.0
        b0, b1, b2, b3 = word_codes(words, ASM)
        w = _logical_tile(
            _dequant(b0, s, c, z, SYM, PRE_SCALE, EXACT_FMA), _dequant(b1, s, c, z, SYM, PRE_SCALE, EXACT_FMA),
            _dequant(b2, s, c, z, SYM, PRE_SCALE, EXACT_FMA), _dequant(b3, s, c, z, SYM, PRE_SCALE, EXACT_FMA),
            BN, BK,
        )
        if FP32_DOT:
            # The interpreter: an fp32 dot (its bf16 dot is wrong), no rounding of w.
            part = tl.dot(w, xt.to(tl.float32))
        elif PRE_SCALE:
            acc = tl.dot(w.to(xt.dtype), xt, acc)
        else:
            part = tl.dot(w.to(xt.dtype), xt)
        if FP32_DOT or not PRE_SCALE:
            if PRE_SCALE:
                acc += part
            else:
                acc += part * s[:, None]
                if not SYM:
                    acc += z[:, None] * tl.sum(xt.to(tl.float32), axis=0)[None, :]
    return acc


@triton.jit
def _tile_columns(pid_n, COLS, HALF, BN: tl.constexpr, GATED: tl.constexpr):
    """Weight column of each tile row, and the output column it feeds."""
    offs = tl.arange(0, BN)
    if GATED:
        # rows 16b + (0..7): linear half, 16b + (8..15): the same columns' gate half
        out = pid_n * (BN // 2) + (offs // 16) * 8 + offs % 8
        ok = out < COLS
        cols = out + ((offs // 8) % 2) * HALF
    else:
        out = pid_n * BN + offs
        ok = out < COLS
        cols = out
    return cols, ok


@triton.jit
def _store(acc, y_ptr, stride_y, routes, m_ok, rw_ptr, pid_n, COLS,
           BN: tl.constexpr, BM: tl.constexpr, GATED: tl.constexpr, HAS_RW: tl.constexpr):
    if GATED:
        pair = acc.reshape(BN // 16, 2, 8, BM).permute(0, 2, 3, 1).reshape(BN // 2, BM, 2)
        lin, gate = tl.split(pair)
        out = lin * (gate / (1.0 + tl.exp(-gate)))
        offs_o = pid_n * (BN // 2) + tl.arange(0, BN // 2)
    else:
        out = acc
        offs_o = pid_n * BN + tl.arange(0, BN)
    if HAS_RW:
        out *= tl.load(rw_ptr + routes, mask=m_ok, other=0.0)[None, :]
    ptrs = y_ptr + routes.to(tl.int64)[None, :] * stride_y + offs_o[:, None]
    tl.store(ptrs, out.to(y_ptr.dtype.element_ty), mask=m_ok[None, :] & (offs_o < COLS)[:, None])


@triton.jit
def _key_counts(ids_ptr, R, E, KEYS: tl.constexpr, SCAN: tl.constexpr):
    """Routes per key (:func:`_route_experts`) over all ``R`` routes, ``[KEYS]``: lane
    ``e < E`` expert e's, lane ``E`` the stray routes', the lanes above it 0. ``SCAN`` ids
    a step."""
    offs = tl.arange(0, SCAN)
    counts = tl.zeros((KEYS,), dtype=tl.int32)
    r0 = 0
    while r0 < R:  # a run-time bound: a while loop (the interpreter cannot take one in range)
        key = _route_experts(ids_ptr, r0 + offs, R, E)
        counts += tl.histogram(key, KEYS, mask=key >= 0)
        r0 += SCAN
    return counts


@triton.jit
def _window_routes(ids_ptr, R, E, e, m0, m_end, BM: tl.constexpr, SCAN_LOG: tl.constexpr):
    """The routes of key ``e`` of ranks ``m0 + j`` (in route order, the order the
    schedule kernel's stable sort gives), ``j < m_end - m0``, as ``[BM]`` (0 in the other
    slots). Scans the ids ``SCAN`` at a time up to the window's last route: a running
    count of the key's routes, and in a step that holds some of the window the position of
    each slot's route by binary search over the step's inclusive counts."""
    SCAN: tl.constexpr = 1 << SCAN_LOG
    offs = tl.arange(0, SCAN)
    want = m0 + 1 + tl.arange(0, BM)  # the inclusive count at each slot's route
    routes = tl.zeros((BM,), dtype=tl.int32)
    run = m0 * 0  # routes of key e before this step
    r0 = 0
    while (r0 < R) & (run < m_end):
        mine = (_route_experts(ids_ptr, r0 + offs, R, E) == e).to(tl.int32)
        incl = run + tl.cumsum(mine, axis=0)
        count = tl.sum(mine, axis=0)
        if run + count > m0:
            # pos: how many of the step's inclusive counts lie below want (nondecreasing)
            pos = tl.zeros((BM,), dtype=tl.int32)
            for s in tl.static_range(SCAN_LOG):  # steps SCAN/2, SCAN/4, ..., 1
                below = tl.gather(incl, pos + ((SCAN >> (s + 1)) - 1), 0) < want
                pos = tl.where(below, pos + (SCAN >> (s + 1)), pos)
            routes = tl.where((want > run) & (want <= run + count), r0 + pos, routes)
        run += count
        r0 += SCAN
    return routes


@triton.jit
def _scheduled_tile(
    tile, e, first, count, first_tile, x_ptr, stride_x, x_div, w_ptr, s_ptr, z_ptr, ids_ptr, sorted_ptr,
    rw_ptr, y_ptr, stride_y, R, E, N, COLS, HALF, G,
    K: tl.constexpr, GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    SCHEDULE_KERNEL: tl.constexpr, SCAN_LOG: tl.constexpr,
    X_SORTED: tl.constexpr, GATED: tl.constexpr, HAS_RW: tl.constexpr, SYM: tl.constexpr,
    PRE_SCALE: tl.constexpr, EXACT_FMA: tl.constexpr, ASM: tl.constexpr, FP32_DOT: tl.constexpr,
    SCALE_PAIRS: tl.constexpr, SPLIT_TAIL: tl.constexpr,
):
    """One (expert, M-tile, N-tile) of the schedule: tiles run expert by expert, and
    within an expert N-tile by N-tile with its M-tiles side by side. ``e``: the expert
    (``E``: the stray routes, NaN rows, :func:`_expert_tile`), with ``count`` routes, its
    first tile ``first_tile`` and (``SCHEDULE_KERNEL``) its first sorted position
    ``first``. With ``SPLIT_TAIL``, an M-tile of at most ``BM / 2`` routes (an expert's
    last) runs at half width: half the MMA, the same weight tile."""
    m_tiles = (count + BM - 1) // BM
    local = tile - first_tile
    pid_n = local // m_tiles
    m0 = (local % m_tiles) * BM
    cols, n_ok = _tile_columns(pid_n, COLS, HALF, BN, GATED)
    if SPLIT_TAIL and count - m0 <= BM // 2:
        _m_tile(m0, count, first, pid_n, cols, n_ok, e, x_ptr, stride_x, x_div, w_ptr, s_ptr, z_ptr, ids_ptr,
                sorted_ptr, rw_ptr, y_ptr, stride_y, R, E, N, COLS, G, K, GROUP, BM // 2, BN, BK, SCHEDULE_KERNEL,
                SCAN_LOG, X_SORTED, GATED, HAS_RW, SYM, PRE_SCALE, EXACT_FMA, ASM, FP32_DOT, SCALE_PAIRS)
    else:
        _m_tile(m0, count, first, pid_n, cols, n_ok, e, x_ptr, stride_x, x_div, w_ptr, s_ptr, z_ptr, ids_ptr,
                sorted_ptr, rw_ptr, y_ptr, stride_y, R, E, N, COLS, G, K, GROUP, BM, BN, BK, SCHEDULE_KERNEL,
                SCAN_LOG, X_SORTED, GATED, HAS_RW, SYM, PRE_SCALE, EXACT_FMA, ASM, FP32_DOT, SCALE_PAIRS)


@triton.jit
def _m_tile(
    m0, count, first, pid_n, cols, n_ok, e, x_ptr, stride_x, x_div, w_ptr, s_ptr, z_ptr, ids_ptr, sorted_ptr,
    rw_ptr, y_ptr, stride_y, R, E, N, COLS, G,
    K: tl.constexpr, GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    SCHEDULE_KERNEL: tl.constexpr, SCAN_LOG: tl.constexpr,
    X_SORTED: tl.constexpr, GATED: tl.constexpr, HAS_RW: tl.constexpr, SYM: tl.constexpr,
    PRE_SCALE: tl.constexpr, EXACT_FMA: tl.constexpr, ASM: tl.constexpr, FP32_DOT: tl.constexpr,
    SCALE_PAIRS: tl.constexpr,
):
    """The routes of ranks ``m0 ..`` (before ``count``) of expert ``e`` (or of the stray
    routes, ``e == E``), one N-tile: read from the schedule kernel's sorted routes, or
    found in the ids (:func:`_window_routes`)."""
    slot = m0 + tl.arange(0, BM)
    m_ok = slot < count
    if SCHEDULE_KERNEL:
        pos = first + slot
        routes = tl.load(sorted_ptr + pos, mask=m_ok, other=0)
        if X_SORTED:
            x_rows = pos.to(tl.int64) * stride_x
        else:
            x_rows = (routes // x_div).to(tl.int64) * stride_x
    else:
        routes = _window_routes(ids_ptr, R, E, e, m0, tl.minimum(count, m0 + BM), BM, SCAN_LOG)
        x_rows = (routes // x_div).to(tl.int64) * stride_x
    acc = _expert_tile(
        x_ptr, x_rows, m_ok, w_ptr, s_ptr, z_ptr, e, E, cols, n_ok, N, G,
        K, GROUP, BM, BN, BK, SYM, PRE_SCALE, EXACT_FMA, ASM, FP32_DOT, SCALE_PAIRS,
    )
    _store(acc, y_ptr, stride_y, routes, m_ok, rw_ptr, pid_n, COLS, BN, BM, GATED, HAS_RW)


@triton.jit
def _schedule_tile(
    tile, ends, firsts, counts, offs, x_ptr, stride_x, x_div, w_ptr, s_ptr, z_ptr, ids_ptr, sched_ptr,
    rw_ptr, y_ptr, stride_y, R, E, N, COLS, HALF, G,
    K: tl.constexpr, GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    SCHEDULE_KERNEL: tl.constexpr, SCAN_LOG: tl.constexpr,
    X_SORTED: tl.constexpr, GATED: tl.constexpr, HAS_RW: tl.constexpr, SYM: tl.constexpr,
    PRE_SCALE: tl.constexpr, EXACT_FMA: tl.constexpr, ASM: tl.constexpr, FP32_DOT: tl.constexpr,
    SCALE_PAIRS: tl.constexpr, SPLIT_TAIL: tl.constexpr,
):
    """The key of ``tile`` (the lane of ``ends``, each key's end tile, whose tiles hold
    it: in ``[0, E]``) with its route count and first tile — read from the schedule
    kernel's buffer, or from ``counts`` and ``firsts`` (``offs``: the lanes) — and the
    tile run (:func:`_scheduled_tile`)."""
    e = tl.sum((ends <= tile).to(tl.int32), axis=0)
    if SCHEDULE_KERNEL:
        first = tl.load(sched_ptr + e)
        count = tl.load(sched_ptr + e + 1) - first
        first_tile = tl.load(sched_ptr + (E + 2) + e)
    else:
        first = 0
        count = tl.sum(tl.where(offs == e, counts, 0), axis=0)
        first_tile = tl.sum(tl.where(offs == e, firsts, 0), axis=0)
    _scheduled_tile(
        tile, e, first, count, first_tile, x_ptr, stride_x, x_div, w_ptr, s_ptr, z_ptr, ids_ptr,
        sched_ptr + 2 * (E + 2), rw_ptr, y_ptr, stride_y, R, E, N, COLS, HALF, G, K, GROUP, BM, BN, BK,
        SCHEDULE_KERNEL, SCAN_LOG, X_SORTED, GATED, HAS_RW, SYM, PRE_SCALE, EXACT_FMA, ASM, FP32_DOT, SCALE_PAIRS,
        SPLIT_TAIL,
    )


# Route counts and the tile bound change with every call: not specialised on, so a new
# batch size reuses the compiled kernel.
@triton.jit(do_not_specialize=["x_div", "R", "E", "TILES", "PROGS"])
def moe_w8a16_kernel(
    x_ptr, stride_x, x_div,
    w_ptr, s_ptr, z_ptr,
    ids_ptr, sched_ptr, rw_ptr,
    y_ptr, stride_y,
    R, E, N, COLS, HALF, G, TILES, PROGS,
    K: tl.constexpr, GROUP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    R_PAD: tl.constexpr, E_PAD: tl.constexpr, KEYS: tl.constexpr, SCAN_LOG: tl.constexpr,
    SCHEDULED: tl.constexpr, SCHEDULE_KERNEL: tl.constexpr, PERSISTENT: tl.constexpr, X_SORTED: tl.constexpr,
    GATED: tl.constexpr, HAS_RW: tl.constexpr, SYM: tl.constexpr, PRE_SCALE: tl.constexpr,
    EXACT_FMA: tl.constexpr, ASM: tl.constexpr, FP32_DOT: tl.constexpr, SCALE_PAIRS: tl.constexpr,
    SPLIT_TAIL: tl.constexpr,
):
    """``y[route, col]`` for every route, over ``COLS`` output columns (``N``, or the
    SwiGLU's ``HALF = N / 2`` when ``GATED``). See the module docstring. ``sched_ptr``:
    :func:`route_schedule_kernel`'s buffer when ``SCHEDULE_KERNEL``; otherwise a
    scheduled program counts the routes per key itself (:func:`_key_counts`)."""
    if SCHEDULED:
        pid = tl.program_id(0)
        if SCHEDULE_KERNEL:
            offs = tl.arange(0, E_PAD)
            ends = tl.load(sched_ptr + (E + 2) + 1 + offs, mask=offs < E, other=2**30)
            total = tl.load(sched_ptr + (E + 2) + E + 1)  # the experts' tiles, then the stray routes'
            counts, firsts = ends, ends  # read from the buffer per tile
        else:
            offs = tl.arange(0, KEYS)
            counts = _key_counts(ids_ptr, R, E, KEYS, 1 << SCAN_LOG)
            tiles = (counts + BM - 1) // BM * tl.cdiv(COLS, BN // 2 if GATED else BN)
            ends = tl.cumsum(tiles, axis=0)
            firsts = ends - tiles
            # the experts' tiles, then the stray routes' (the lanes above E hold no route:
            # their ends equal the total, past every tile run)
            total = tl.sum(tiles, axis=0)
        if PERSISTENT:
            for tile in range(pid, TILES, PROGS):
                if tile < total:
                    _schedule_tile(
                        tile, ends, firsts, counts, offs, x_ptr, stride_x, x_div, w_ptr, s_ptr, z_ptr, ids_ptr,
                        sched_ptr, rw_ptr, y_ptr, stride_y, R, E, N, COLS, HALF, G, K, GROUP, BM, BN, BK,
                        SCHEDULE_KERNEL, SCAN_LOG, X_SORTED, GATED, HAS_RW, SYM, PRE_SCALE, EXACT_FMA, ASM,
                        FP32_DOT, SCALE_PAIRS, SPLIT_TAIL,
                    )
        elif pid < total:
            _schedule_tile(
                pid, ends, firsts, counts, offs, x_ptr, stride_x, x_div, w_ptr, s_ptr, z_ptr, ids_ptr,
                sched_ptr, rw_ptr, y_ptr, stride_y, R, E, N, COLS, HALF, G, K, GROUP, BM, BN, BK,
                SCHEDULE_KERNEL, SCAN_LOG, X_SORTED, GATED, HAS_RW, SYM, PRE_SCALE, EXACT_FMA, ASM,
                FP32_DOT, SCALE_PAIRS, SPLIT_TAIL,
            )
    else:
        pid_d = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_r = tl.arange(0, R_PAD)
        ids = _route_experts(ids_ptr, offs_r, R, E)
        # The pid_d-th distinct key (an expert, or E for the stray routes), in order of
        # first appearance.
        earlier = (ids[:, None] == ids[None, :]) & (offs_r[None, :] < offs_r[:, None])
        first = (tl.max(earlier.to(tl.int32), axis=1) == 0) & (ids >= 0)
        pick = first & (tl.cumsum(first.to(tl.int32), axis=0) == pid_d + 1)
        if tl.sum(pick.to(tl.int32), axis=0) > 0:
            e = tl.sum(tl.where(pick, ids, 0), axis=0)
            mine = ids == e
            count = tl.sum(mine.to(tl.int32), axis=0)
            slot = tl.cumsum(mine.to(tl.int32), axis=0) - 1
            cols, n_ok = _tile_columns(pid_n, COLS, HALF, BN, GATED)
            for m0 in range(0, R_PAD, BM):
                if m0 < count:
                    want = m0 + tl.arange(0, BM)
                    hit = mine[None, :] & (slot[None, :] == want[:, None])
                    routes = tl.sum(tl.where(hit, offs_r[None, :], 0), axis=1)
                    m_ok = want < count
                    x_rows = (routes // x_div).to(tl.int64) * stride_x
                    acc = _expert_tile(
                        x_ptr, x_rows, m_ok, w_ptr, s_ptr, z_ptr, e, E, cols, n_ok, N, G,
                        K, GROUP, BM, BN, BK, SYM, PRE_SCALE, EXACT_FMA, ASM, FP32_DOT, SCALE_PAIRS,
                    )
                    _store(acc, y_ptr, stride_y, routes, m_ok, rw_ptr, pid_n, COLS, BN, BM, GATED, HAS_RW)


@triton.jit(do_not_specialize=["R", "E", "n_tiles", "x_div"])
def route_schedule_kernel(
    ids_ptr, sched_ptr,
    R, E, n_tiles, x_div,
    R_MAX: tl.constexpr, BM: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr, WRITE_TOKENS: tl.constexpr,
):
    """One program: counting-sort the ``R`` routes by expert (stable), the stray routes
    (an id outside ``[0, E)``) last, into ``sched_ptr`` (:func:`schedule_words`):
    ``starts[e]`` (first sorted position of expert e; ``starts[E]`` that of the stray
    routes, ``starts[E + 1] = R``), ``tiles[e]`` (first tile of expert e:
    ``ceil(count / BM)`` M-tiles × ``n_tiles``; ``tiles[E]`` the stray routes' first,
    ``tiles[E + 1]`` = all tiles), ``sorted`` (the routes in that order) and, with
    ``WRITE_TOKENS``, each sorted position's token (its activation row), for the permuted
    copy of the activations. ``R_MAX`` (a power of two >= R) bounds the loops at compile
    time."""
    starts_ptr = sched_ptr
    tiles_ptr = sched_ptr + (E + 2)
    sorted_ptr = sched_ptr + 2 * (E + 2)
    tokens_ptr = sorted_ptr + R
    offs_e = tl.arange(0, E_PAD)
    offs_c = tl.arange(0, CHUNK)
    counts = tl.zeros((E_PAD,), dtype=tl.int32)
    strays = 0
    for r0 in range(0, R_MAX, CHUNK):
        key = _route_experts(ids_ptr, r0 + offs_c, R, E)
        expert = tl.where(key < E, key, -1)  # the stray key E would meet lane E when E < E_PAD
        counts += tl.sum((expert[None, :] == offs_e[:, None]).to(tl.int32), axis=1)
        strays += tl.sum((key == E).to(tl.int32), axis=0)
    starts = tl.cumsum(counts, axis=0) - counts
    tiles_per = ((counts + BM - 1) // BM) * n_tiles
    tile_starts = tl.cumsum(tiles_per, axis=0) - tiles_per
    routed = tl.sum(counts, axis=0)
    routed_tiles = tl.sum(tiles_per, axis=0)
    tl.store(starts_ptr + offs_e, starts, mask=offs_e < E)
    tl.store(tiles_ptr + offs_e, tile_starts, mask=offs_e < E)
    tl.store(starts_ptr + E, routed)
    tl.store(starts_ptr + E + 1, R)
    tl.store(tiles_ptr + E, routed_tiles)
    tl.store(tiles_ptr + E + 1, routed_tiles + ((strays + BM - 1) // BM) * n_tiles)
    running = starts
    for r0 in range(0, R_MAX, CHUNK):
        key = _route_experts(ids_ptr, r0 + offs_c, R, E)
        expert = tl.where(key < E, key, -1)
        onehot = (expert[None, :] == offs_e[:, None]).to(tl.int32)  # [E_PAD, CHUNK]
        rank = tl.cumsum(onehot, axis=1) - onehot
        pos = tl.sum(onehot * (running[:, None] + rank), axis=0)
        ok = expert >= 0
        tl.store(sorted_ptr + pos, r0 + offs_c, mask=ok)
        if WRITE_TOKENS:
            tl.store(tokens_ptr + pos, (r0 + offs_c) // x_div, mask=ok)
        running += tl.sum(onehot, axis=1)
    # The stray routes, in a pass of their own (none in a well-formed call): kept out of
    # the loop above, whose [E_PAD, CHUNK] one-hot already fills the registers.
    if strays > 0:
        stray_next = routed
        for r0 in range(0, R_MAX, CHUNK):
            stray = (_route_experts(ids_ptr, r0 + offs_c, R, E) == E).to(tl.int32)
            pos = stray_next + tl.cumsum(stray, axis=0) - 1
            tl.store(sorted_ptr + pos, r0 + offs_c, mask=stray > 0)
            if WRITE_TOKENS:
                tl.store(tokens_ptr + pos, (r0 + offs_c) // x_div, mask=stray > 0)
            stray_next += tl.sum(stray, axis=0)
