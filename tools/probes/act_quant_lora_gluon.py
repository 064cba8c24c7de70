"""Can the SVDQuant NVFP4 pre-GEMM beat the shipped Triton kernel when it is written in Gluon?
A candidate kernel, its launcher, a check and a timing (sm_90a; compiles on any machine)::

    python -m tools.probes.act_quant_lora_gluon --report          # registers, spills, SASS a code (no GPU)
    python -m tools.probes.act_quant_lora_gluon [--json PATH]     # check and time it (an H100 or H200)

What the shipped kernel's profile asked for (``quantcore/kernels/svdquant/README.md``, "Where
the time goes on the H200"): NVFP4's quantizer is bound by issue and latency — 23 SASS
instructions an element, half the issue slots used, 12 warps an SM — where Triton gives a
thread half of each 16-element block (a shuffle for the block's max, the scale made twice)
and spends integer instructions on every ``cp.async`` address. Here:

- **TMA**: each step's ``BM × BK`` tile of x and ``RP × BK`` tile of ``lora_downᵀ`` come by
  one bulk copy each into a ring of ``STAGES`` shared-memory stages (mbarriers), no address
  arithmetic per element; rows past M arrive as zeros.
- **One read of x, two consumers**: the wgmma reads the stage for the LoRA-down (swap-AB:
  ``acc[RP, BM] += lora_downᵀ[RP, BK] · xᵀ[BK, BM]``, both operands from shared memory), and
  the quantizer reads the same stage into registers in a layout that gives each thread whole
  16-element blocks (``[1, 16]`` per thread): the block max stays in the thread, the scale
  and its thresholds are made once per block.
- **The quantizer's arithmetic is the shipped kernel's own** (``e2m1_code``, ``div6_rn``,
  imported from ``quantcore/kernels/svdquant/triton_source.py``): the same rounding rules,
  so the same bytes.
- **The LoRA partials**: the K range of a row tile is split between ``SPLIT`` programs;
  each stores its ``[R, BM]`` partial and the last to arrive sums them in split order
  (``quantcore/triton/gluon_split_k.py``: deterministic, one launch).

Not shipped: nothing calls it but this probe. The GPU run checks codes and scales bit for
bit and the LoRA output against ``svdquant_torch``, then times it beside the shipped kernel,
cuBLAS's LoRA-down alone and a copy of the op's bytes (CUDA graphs), at M = 4352.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from quantcore.kernels.svdquant.triton_source import _max_nan, div6_rn, e2m1_code
from quantcore.triton.gluon_split_k import tile_store

__all__ = ["GluonTile", "compile_report", "gluon_act_quant_lora", "main"]

SHAPES = [(4352, n, r) for n in (3840, 10240) for r in (32, 128)]


@gluon.jit
def _issue(x_desc, wt_desc, x_smem, w_smem, bar, stage, blk, m0, BK: gl.constexpr):
    """Step ``blk``'s tiles of x and ``lora_downᵀ`` into ``stage``, completing on its barrier."""
    b = bar.index(stage)
    mbarrier.expect(b, x_desc.block_type.nbytes + wt_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(x_desc, [m0, blk * BK], b, x_smem.index(stage))
    tma.async_copy_global_to_shared(wt_desc, [0, blk * BK], b, w_smem.index(stage))


@gluon.jit
def _quantize_store(x, rs_ptr, q_ptr, s_ptr, m0, col0, M, M_PAD, N: gl.constexpr, HAS_SMOOTH: gl.constexpr,
                    BM: gl.constexpr, BK: gl.constexpr, TREE: gl.constexpr, QL: gl.constexpr):
    """NVFP4 codes and scales of one ``BM × BK`` tile of x (rows from ``m0``, columns from
    ``col0``), held ``[1, 16]`` a thread in ``QL``: stored as 32-bit words (eight codes, the
    element 8j + k in bits 4k) and scale bytes (``[N/16, M_PAD]``), as the format lays them out."""
    NB: gl.constexpr = BK // 16
    v = x.to(gl.float32)
    if HAS_SMOOTH:
        v = v * gl.expand_dims(gl.load(rs_ptr + col0 + gl.arange(0, BK, layout=gl.SliceLayout(0, QL))), 0)
    v3 = gl.reshape(v, [BM, NB, 16])
    L3: gl.constexpr = v3.type.layout
    amax = gl.reduce(gl.abs(v3), 2, _max_nan)
    bad = ~(amax <= 3.4028234663852886e38)  # the block holds a NaN or an Inf
    s = gl.minimum(div6_rn(amax), 448.0)
    sbits = gl.maximum(s.to(gl.float8e4nv).to(gl.uint8, bitcast=True).to(gl.int32), 1)  # a zero scale → 2⁻⁹
    s8 = gl.where(bad, float("nan"), sbits.to(gl.uint8).to(gl.float8e4nv, bitcast=True).to(gl.float32))
    sbits = gl.where(bad, 0x7F, sbits)
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    real = gl.expand_dims(rows < M, 1)
    code = e2m1_code(v3, gl.expand_dims(s8, 2), TREE)
    # Padding rows are zero bytes: their v is ±0, so the sign bits are dropped per block
    # there, as for a non-finite block.
    keep = gl.where(bad | ~real, 0x77777777, -1)
    lo, hi = gl.split(gl.reshape(code, [BM, NB, 8, 2]))
    lo, hi = gl.split(gl.reshape(lo | (hi << 4), [BM, NB, 4, 2]))
    lo, hi = gl.split(gl.reshape(lo | (hi << 8), [BM, NB, 2, 2]))
    words = lo | (hi << 16)
    WL: gl.constexpr = words.type.layout
    words = words & gl.expand_dims(gl.convert_layout(keep, gl.SliceLayout(2, WL), assert_trivial=True), 2)
    w_rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, gl.SliceLayout(2, WL)))
    w_blocks = gl.arange(0, NB, layout=gl.SliceLayout(0, gl.SliceLayout(2, WL)))
    w_half = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, WL)))
    word_ptrs = (q_ptr + gl.expand_dims(gl.expand_dims(w_rows.to(gl.int64) * (N // 8) + col0 // 8, 1), 2)
                 + gl.expand_dims(gl.expand_dims(w_blocks * 2, 0), 2) + gl.expand_dims(gl.expand_dims(w_half, 0), 1))
    gl.store(word_ptrs, words)
    s_blocks = gl.arange(0, NB, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    scale_ptrs = s_ptr + gl.expand_dims((col0 // 16 + s_blocks).to(gl.int64) * M_PAD, 0) + gl.expand_dims(rows, 1)
    gl.store(scale_ptrs, gl.where(real, sbits, 0).to(gl.uint8))


@gluon.jit
def gluon_act_quant_lora(x_desc, wt_desc, rs_ptr, q_ptr, s_ptr, l_ptr, ws_ptr, cnt_ptr, M, M_PAD, split_k,
                         N: gl.constexpr, R: gl.constexpr, HAS_SMOOTH: gl.constexpr, BM: gl.constexpr,
                         BK: gl.constexpr, RP: gl.constexpr, STAGES: gl.constexpr, PER: gl.constexpr,
                         SPLIT: gl.constexpr, TREE: gl.constexpr, NUM_WARPS: gl.constexpr):
    """Program (t, s): row tile t (``BM`` rows) over the K blocks ``[s·PER, (s+1)·PER)`` of
    ``BK`` columns (module docstring). ``q_ptr`` is the codes as int32 words, ``s_ptr`` the
    scales as bytes; ``lora_downᵀ`` is ``[RP, N]``, its rows past R zero."""
    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    m0 = pid * BM
    NBLK: gl.constexpr = N // BK
    b0 = pid_k * PER
    n_iter = gl.minimum(NBLK - b0, PER)
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], x_desc.layout)
    w_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, RP, BK], wt_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bar.index(s), count=1)
    fence_async_shared()
    for p in gl.static_range(STAGES):
        if p < n_iter:
            _issue(x_desc, wt_desc, x_smem, w_smem, bar, p, b0 + p, m0, BK)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                  instr_shape=[16, BM, 16])
    QL: gl.constexpr = gl.BlockedLayout([1, 16], [32 // (BK // 16), BK // 16], [NUM_WARPS, 1], [1, 0])
    acc = gl.zeros([RP, BM], gl.float32, mma)
    for i in range(n_iter):
        stage = i % STAGES
        mbarrier.wait(bar.index(stage), (i // STAGES) & 1)
        acc = warpgroup_mma(w_smem.index(stage), x_smem.index(stage).permute((1, 0)), acc, is_async=True)
        x = x_smem.index(stage).load(QL)
        _quantize_store(x, rs_ptr, q_ptr, s_ptr, m0, (b0 + i) * BK, M, M_PAD, N, HAS_SMOOTH, BM, BK, TREE, QL)
        acc = warpgroup_mma_wait(0, deps=[acc])
        gl.thread_barrier()  # every warp has read the stage before its next copy lands
        if i + STAGES < n_iter:
            _issue(x_desc, wt_desc, x_smem, w_smem, bar, stage, b0 + i + STAGES, m0, BK)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bar.index(s))
    tile_store(acc, pid, pid_k, 0, m0, l_ptr, l_ptr, ws_ptr, cnt_ptr, M_PAD, R, R, split_k, SPLIT, False, RP, BM,
               NUM_WARPS)


class GluonTile:
    """A launch of :func:`gluon_act_quant_lora`: ``bm`` rows and ``bk`` columns a step,
    ``stages`` in the ring, the K blocks of a row tile split between ``split`` programs."""

    def __init__(self, bm: int = 64, bk: int = 64, stages: int = 4, split: int = 4) -> None:
        self.bm, self.bk, self.stages, self.split = bm, bk, stages, split

    def describe(self) -> str:
        return f"gluon bm {self.bm}, bk {self.bk}, {self.stages} stages, split {self.split}"


def _descriptors(x: torch.Tensor, wt: torch.Tensor, tile: GluonTile) -> tuple[Any, Any]:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    x_layout = gl.NVMMASharedLayout.get_default_for([tile.bm, tile.bk], gl.bfloat16)
    w_layout = gl.NVMMASharedLayout.get_default_for([wt.shape[0], tile.bk], gl.bfloat16)
    return (TensorDescriptor.from_tensor(x, [tile.bm, tile.bk], x_layout),
            TensorDescriptor.from_tensor(wt, [wt.shape[0], tile.bk], w_layout))


def padded_transpose(lora_down: torch.Tensor) -> torch.Tensor:
    """``lora_downᵀ`` ``[RP, N]``, RP = R rounded up to 64 (the wgmma's M), the extra rows zero."""
    n, r = lora_down.shape
    rp = -(-r // 64) * 64
    out = torch.zeros(rp, n, dtype=lora_down.dtype, device=lora_down.device)
    out[:r] = lora_down.t()
    return out


def _blocks(n: int, tile: GluonTile) -> tuple[int, int]:
    blocks = n // tile.bk
    per = -(-blocks // tile.split)
    return per, -(-blocks // per)


def launch_args(x: torch.Tensor, wt: torch.Tensor, rsmooth: torch.Tensor | None, r: int, tile: GluonTile,
                out: tuple[torch.Tensor, torch.Tensor, torch.Tensor], ws: torch.Tensor,
                cnt: torch.Tensor) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """(grid, arguments, constexprs) of one launch; ``out`` the codes, scales and LoRA output."""
    m, n = x.shape
    m_pad = out[0].shape[0]
    per, split = _blocks(n, tile)
    x_desc, wt_desc = _descriptors(x, wt, tile)
    q, s, lora = out
    args = (x_desc, wt_desc, rsmooth if rsmooth is not None else lora, q.view(torch.int32), s.view(torch.uint8),
            lora, ws, cnt, m, m_pad, split)
    const = dict(N=n, R=r, HAS_SMOOTH=rsmooth is not None, BM=tile.bm, BK=tile.bk, RP=wt.shape[0],
                 STAGES=tile.stages, PER=per, SPLIT=split > 1, TREE=1, NUM_WARPS=4)
    return (m_pad // tile.bm, split), args, const


def run(x: torch.Tensor, wt: torch.Tensor, rsmooth: torch.Tensor | None, r: int, tile: GluonTile) -> Any:
    """The op's outputs for ``x`` (bf16 ``[M, N]``, N a multiple of ``tile.bk``)."""
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.kernels.svdquant.base import allocate_outputs
    from quantcore.ops.act_quant_lora import ActQuantLoraOutput

    m, n = x.shape
    q, s, lora = allocate_outputs(SVDQuantAct(fp4=True), m, n, r, x.device)
    split = _blocks(n, tile)[1]
    ws = torch.empty(max(1, split) * q.shape[0] * r, dtype=torch.float32, device=x.device)
    cnt = torch.zeros(q.shape[0] // tile.bm, dtype=torch.int32, device=x.device)
    grid, args, const = launch_args(x, wt, rsmooth, r, tile, (q, s, lora), ws, cnt)
    gluon_act_quant_lora[grid](*args, **const, num_warps=4)
    return ActQuantLoraOutput(q, s, lora)


def compile_report(n: int = 3840, r: int = 32, tile: GluonTile | None = None) -> dict[str, Any]:
    """Compile for sm_90a (no GPU): registers, spill stack, shared memory, and the SASS
    instructions an element of the step loop."""
    from triton.runtime.jit import mangle_type

    from quantcore.triton.compile_report import compile_sm90, longest_inner_loop

    tile = tile or GluonTile()
    m = 4352
    x = torch.zeros(m, n, dtype=torch.bfloat16)
    wt = torch.zeros(-(-r // 64) * 64, n, dtype=torch.bfloat16)
    q = torch.zeros(m, n // 2, dtype=torch.uint8)
    s = torch.zeros(n // 16, m, dtype=torch.float8_e4m3fn)
    lora = torch.zeros(m, r, dtype=torch.float32)
    _, args, const = launch_args(x, wt, torch.zeros(n), r, tile, (q, s, lora), torch.zeros(4), torch.zeros(4, dtype=torch.int32))
    names = [a for a in gluon_act_quant_lora.arg_names if a not in const]
    signature = {name: mangle_type(arg) for name, arg in zip(names, args, strict=True)}
    # The pointers a launch specialises as 16-byte aligned (torch's allocations are).
    aligned = ["rs_ptr", "q_ptr", "s_ptr", "l_ptr", "ws_ptr", "cnt_ptr"]
    compiled = compile_sm90(gluon_act_quant_lora, signature, const, divisible=aligned,
                            options={"num_warps": 4, "enable_fp_fusion": False}, gluon=True)
    per_thread = tile.bm * tile.bk / 128
    body = longest_inner_loop(compiled.sass)
    return {"N": n, "R": r, "tile": tile.describe(), "registers": compiled.registers,
            "spill_stack": compiled.spill_stack, "shared": compiled.shared,
            "instr_per_element": round(len(body) / per_thread, 1),
            "tma_copies_a_step": sum(op.startswith("UTMALDG") for op in body)}


def _run_on(xs: list[torch.Tensor], wt: torch.Tensor, rsmooth: torch.Tensor | None, r: int, tile: GluonTile,
            i: int) -> Any:
    return run(xs[i % len(xs)], wt, rsmooth, r, tile)


def _check_and_time(m: int, n: int, r: int, tiles: list[GluonTile], gen: torch.Generator) -> list[dict[str, Any]]:
    from quantcore.backends.svdquant_torch import TorchActQuantLora
    from quantcore.backends.triton_nvfp4 import TritonNVFP4
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.timing import time_interleaved

    fmt = SVDQuantAct(fp4=True)
    layer = {"lora_down": (torch.randn(n, r, generator=gen) * 0.05).to("cuda", torch.bfloat16),
             "smooth": torch.exp(torch.randn(n, generator=gen) * 0.5).to("cuda", torch.bfloat16)}
    sets = max(2, min(64, -(-(100 << 20) // (2 * m * n))))
    xs = [(torch.randn(m, n, generator=gen) * 2).to("cuda", torch.bfloat16) for _ in range(sets)]
    xs[0][1, 5] = float("nan")  # a bad block, checked below
    shipped = TritonNVFP4(fmt, "cuda")
    prepared = shipped.prepare(layer, dtype=torch.bfloat16)
    golden = TorchActQuantLora(fmt, "cuda")
    gold = golden(xs[0], golden.prepare(layer, dtype=torch.bfloat16))
    wt = padded_transpose(prepared.lora_down)
    rows: list[dict[str, Any]] = []
    fns: list[Callable[[int], object]] = [lambda i: xs[i % sets] @ layer["lora_down"],
                                          lambda i: shipped(xs[i % sets], prepared)]
    names = ["cublas_lora_down", "shipped"]
    for tile in tiles:
        row: dict[str, Any] = {"M": m, "N": n, "R": r, "tile": tile.describe()}
        try:
            out = run(xs[0], wt, prepared.rsmooth, r, tile)
            again = run(xs[0], wt, prepared.rsmooth, r, tile)
            torch.cuda.synchronize()
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            continue
        finite = torch.isfinite(gold.lora_act_out)
        diff = (out.lora_act_out.double() - gold.lora_act_out.double())[finite]
        row.update({
            "codes_exact": bool(torch.equal(out.qout, gold.qout)),
            "scales_exact": bool(torch.equal(out.oscales.view(torch.uint8), gold.oscales.view(torch.uint8))),
            "lora_rel": float(diff.norm() / gold.lora_act_out.double()[finite].norm()),
            "lora_nan_rows_match": bool(torch.equal(out.lora_act_out.isnan(), gold.lora_act_out.isnan())),
            "deterministic": bool(torch.equal(out.lora_act_out.view(torch.int32), again.lora_act_out.view(torch.int32))),
        })
        row["ok"] = (row["codes_exact"] and row["scales_exact"] and row["lora_rel"] < 1e-4
                     and row["lora_nan_rows_match"] and row["deterministic"])
        rows.append(row)
        if row["ok"]:
            fns.append(functools.partial(_run_on, xs, wt, prepared.rsmooth, r, tile))
            names.append(tile.describe())
    timings = time_interleaved(fns, "cuda", rounds=5, graph=True, sets=[sets] * len(fns))
    times = dict(zip(names, (t.median_s * 1e6 for t in timings), strict=True))
    for row in rows:
        if row.get("ok"):
            row["us"] = times[row["tile"]]
            row["vs_shipped"] = times["shipped"] / row["us"]
            row["vs_cublas_lora_down"] = times["cublas_lora_down"] / row["us"]
        row["shipped_us"], row["cublas_lora_down_us"] = times["shipped"], times["cublas_lora_down"]
    return rows


def main(out: Path | None) -> int:
    tiles = [GluonTile(64, 64, stages, split) for stages, split in ((4, 2), (4, 4), (4, 8), (3, 4), (6, 4))]
    gen = torch.Generator().manual_seed(1)
    rows: list[dict[str, Any]] = []
    bad = 0
    for m, n, r in SHAPES:
        part = _check_and_time(m, n, r, tiles, gen)
        rows += part
        for row in part:
            if "error" in row or not row.get("ok"):
                bad += 1
                print(f"FAIL M{m} N{n} R{r} {row['tile']}: {row}", flush=True)
            else:
                print(f"M{m} N{n} R{r} {row['tile']:40s} {row['us']:7.1f} µs  {row['vs_shipped']:.2f}x shipped "
                      f"({row['shipped_us']:.1f})  {row['vs_cublas_lora_down']:.2f}x cuBLAS LoRA-down", flush=True)
        torch.cuda.empty_cache()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--report", action="store_true", help="compile for sm_90a and report (no GPU)")
    args = parser.parse_args()
    if args.report:
        for n, r in ((3840, 32), (3840, 128), (10240, 32)):
            print(json.dumps(compile_report(n, r)))
        sys.exit(0)
    if not torch.cuda.is_available():
        sys.exit("act_quant_lora_gluon: needs a CUDA GPU (or --report)")
    sys.exit(main(args.json))
