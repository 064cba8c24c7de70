"""The launcher both Triton registrations share: tiles, grid, the LoRA partial sum.

The kernel (:mod:`.triton_source`) is compiled per format (``FP4``), smooth on/off, N,
R and tile. On CUDA it compiles; on CPU it runs under Triton's interpreter
(``TRITON_INTERPRET=1``) with float32 dot operands; on an Ascend NPU triton-ascend
compiles the same source.

Tiles. A program owns ``bm`` rows and ``1/split`` of N, walking it ``bn`` columns at a
time. ``bm`` trades the LoRA weight's re-reads (each row tile reads all of ``lora_down``
from L2) against parallelism; ``split`` restores parallelism for small M at the price of
``split`` float32 partials summed afterwards. :func:`pick_tile` is the default;
``CONFIGS`` are the candidates :func:`tune_tile` times on a GPU (the ``+tuned`` rows of
``quantcore bench svdquant_prequant``); ``QUANTCORE_SVDQUANT_TUNE=1`` makes every new
shape tune itself on its first call (cached in-process).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import ClassVar

import torch

from quantcore.cost import Cost
from quantcore.errors import KernelInputError
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.kernel import Requirements, Support
from quantcore.ops.act_quant_lora import ActQuantLoraOutput
from quantcore.probe import Capabilities
from quantcore.problem import Problem

from .base import SVDQuantKernel, SVDQuantWeights, allocate_outputs

__all__ = [
    "CONFIGS", "SMEM_BUDGET", "Tile", "TritonActQuantLora", "check_tile", "interpreted", "pick_tile", "smem_bytes",
    "tune_tile",
]

MAX_RANK = 256
ENV_TUNE = "QUANTCORE_SVDQUANT_TUNE"


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    split: int = 1
    num_warps: int = 4
    num_stages: int = 3


#: Candidates for :func:`tune_tile` on a GPU: (bm, bn, split, warps, stages). Each compiles
#: for sm_90 without spilling at R ≤ 128 (``python -m quantcore.backends.svdquant.sm90``);
#: those whose pipelined tiles exceed shared memory for a rank are skipped.
CONFIGS = tuple(
    Tile(bm, bn, split, warps, stages)
    for bm, bn, split, warps, stages in [
        (32, 128, 4, 4, 3), (64, 128, 1, 8, 3), (64, 128, 2, 8, 3), (64, 128, 4, 8, 3), (64, 64, 4, 4, 3),
        (64, 256, 2, 8, 2), (128, 64, 2, 8, 3), (128, 64, 4, 8, 3), (128, 128, 2, 8, 2), (128, 128, 4, 8, 2),
        (128, 64, 8, 8, 3), (64, 128, 8, 8, 3),
    ]
)


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def rank_block(r: int) -> int:
    """The accumulator's width: R rounded up to a power of two, at least 16 (tl.dot)."""
    return max(16, _pow2(r))


#: Shared memory a tile's pipelined loads may take: stages × (x tile + lora_down tile),
#: kept under an A100's 164 KiB so the defaults compile on every SM >= 8.0 GPU.
SMEM_BUDGET = 160 * 1024


def smem_bytes(tile: Tile, r: int) -> int:
    """An upper estimate of the shared memory the software pipeline allocates (2-byte
    operands; the LoRA tile only when R > 0)."""
    w = tile.bn * rank_block(r) if r else 0
    return tile.num_stages * (tile.bm * tile.bn + w) * 2


def pick_tile(m_pad: int, n: int, r: int, fp4: bool, *, sms: int = 132, pad_size: int = 256) -> Tile:
    """The default tile. Under the interpreter: few, large programs (it pays per
    operation, not per element). On a GPU: 64 × 64 tiles with 4 warps and 3 stages — the
    tile ``tune_tile`` picked on 6 of the 8 seed shapes on an H100
    (benchmarks/results/nvidia-h100-80gb-hbm3/svdquant_prequant.json, ``+tuned`` rows),
    30–60% faster there than the 8-warp 128-wide tiles — and split-N until there are two
    programs per SM (four splits at M = 4352), as fits :data:`SMEM_BUDGET`."""
    block = 16 if fp4 else 64
    # A row tile divides pad_size, so it divides every padded M (a multiple of 16, as
    # supports() requires).
    rows = pad_size & -pad_size
    if interpreted():
        bn = min(256, max(block, _pow2(n)))
        while n % bn and bn > block:
            bn //= 2
        return Tile(min(128, m_pad, rows), bn, 1, 4, 1)
    bm = min(64, m_pad, rows)
    tile = Tile(bm, 64, 1, 4, 3)
    for stages in (3, 2, 1):
        tile = Tile(bm, max(64, block), 1, 4, stages)
        if smem_bytes(tile, r) <= SMEM_BUDGET:
            break
    chunks = -(-n // tile.bn)
    split = 1
    while (m_pad // bm) * split < 2 * sms and split * 2 <= chunks and split < 8:
        split *= 2
    return Tile(tile.bm, tile.bn, split, tile.num_warps, tile.num_stages)


def check_tile(tile: Tile, fmt: SVDQuantAct, r: int) -> None:
    problems = []
    if any(v < 16 or v & (v - 1) for v in (tile.bm, tile.bn)):
        problems.append("bm and bn must be powers of two >= 16 (tl.arange, tl.dot)")
    if tile.bn % fmt.block:
        problems.append(f"bn={tile.bn} must be a multiple of the block size {fmt.block}")
    if fmt.pad_size % tile.bm:
        problems.append(f"bm={tile.bm} must divide pad_size={fmt.pad_size}")
    if tile.split < 1:
        problems.append(f"split={tile.split} must be >= 1")
    if r > MAX_RANK:
        problems.append(f"R={r} > {MAX_RANK}")
    if problems:
        raise KernelInputError(f"tile {tile}: " + "; ".join(problems))


_tuned: dict[tuple[object, ...], Tile] = {}


class TritonActQuantLora(SVDQuantKernel):
    """One Triton source for both formats; subclasses pick the format and devices."""

    max_rank: ClassVar[int | None] = MAX_RANK
    requires: ClassVar[Requirements] = Requirements(device_types=frozenset({"cuda", "cpu"}), packages=("triton",))

    #: Share of the copy bandwidth on CUDA (benchmarks/results/nvidia-h100-80gb-hbm3/
    #: svdquant_prequant.json, CUDA graphs): NVFP4 ~30 %, INT4 ~43 %.
    cuda_bandwidth: ClassVar[float] = 0.3

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        from .cost import op_bytes, op_flops

        if caps.device_type == "cpu":
            return Cost(op_bytes(problem), op_flops(problem), 2e-4, 2e-4, 1, "Triton interpreter")
        return Cost(op_bytes(problem), op_flops(problem), cls.cuda_bandwidth, 0.3, 1, "fit to nvidia-h100 results")

    @classmethod
    def check_cuda(cls, caps: Capabilities) -> str | None:
        cc = caps.compute_capability
        if cc is None or cc < (8, 0):
            return f"needs compute capability >= 8.0 (bf16 tl.dot), device has {cc}"
        return None

    @classmethod
    def check_device(cls, caps: Capabilities) -> str | None:
        reason = cls.requires.check(caps)
        if reason or caps.device_type != "cuda":
            return reason
        return cls.check_cuda(caps)

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        base = super().supports(problem)
        if not base:
            return base
        fmt = problem.format
        if isinstance(fmt, SVDQuantAct) and fmt.pad_size % 16:
            return Support.no(f"pad_size={fmt.pad_size}: row tiles need a multiple of 16")
        return base

    def __call__(self, x: torch.Tensor, prepared: SVDQuantWeights) -> ActQuantLoraOutput:
        self.check_call(x, prepared)
        return self.forward(x, prepared)

    def forward(self, x: torch.Tensor, prepared: SVDQuantWeights, *, tile: Tile | None = None) -> ActQuantLoraOutput:
        """The call without validation (inputs must pass :meth:`check_call`)."""
        fmt = self.fmt
        assert isinstance(fmt, SVDQuantAct)
        m, n = x.shape
        r = prepared.r
        qout, oscales, lora = allocate_outputs(fmt, m, n, r, x.device)
        m_pad = qout.shape[0]
        if m_pad == 0:
            return ActQuantLoraOutput(qout, oscales, lora)
        if x.stride(1) != 1:
            x = x.contiguous()
        if tile is None:
            tile = self._tile(x, prepared, m_pad)
        check_tile(tile, fmt, r)
        self._launch(x, prepared, tile, qout, oscales, lora)
        return ActQuantLoraOutput(qout, oscales, lora)

    def _tile(self, x: torch.Tensor, prepared: SVDQuantWeights, m_pad: int) -> Tile:
        fmt = self.fmt
        assert isinstance(fmt, SVDQuantAct)
        n, r = prepared.n, prepared.r
        if x.device.type == "cuda" and not interpreted():
            if os.environ.get(ENV_TUNE) == "1":
                key = (x.device, fmt.fp4, m_pad, n, r, x.dtype, prepared.rsmooth is not None)
                if key not in _tuned:
                    _tuned[key] = tune_tile(self, x, prepared)[0][0]
                    print(f"{self.name}: tuned {key[1:]} -> {_tuned[key]}", file=sys.stderr)
                return _tuned[key]
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            return pick_tile(m_pad, n, r, fmt.fp4, sms=sms, pad_size=fmt.pad_size)
        return pick_tile(m_pad, n, r, fmt.fp4, pad_size=fmt.pad_size)

    def _launch(
        self, x: torch.Tensor, prepared: SVDQuantWeights, tile: Tile,
        qout: torch.Tensor, oscales: torch.Tensor, lora: torch.Tensor,
    ) -> None:
        from .triton_source import act_quant_lora_kernel

        fmt = self.fmt
        assert isinstance(fmt, SVDQuantAct)
        m, n = x.shape
        m_pad, r = qout.shape[0], prepared.r
        chunks = -(-n // tile.bn)
        split = min(tile.split, chunks)
        per_prog = -(-chunks // split) * tile.bn
        split = -(-n // per_prog)
        part = lora if split == 1 or r == 0 else torch.empty(split, m_pad, r, dtype=torch.float32, device=x.device)
        scale_bits = oscales.view(torch.uint8 if fmt.fp4 else torch.int16)
        # Pointers the kernel never reads (no smooth, no LoRA) stand in as x.
        rs = prepared.rsmooth if prepared.rsmooth is not None else x
        w, part_or_x = (prepared.lora_down, part) if r else (x, x)
        act_quant_lora_kernel[(m_pad // tile.bm, split)](
            x, x.stride(0), rs, w, qout, scale_bits, part_or_x,
            m, m_pad,
            N=n, R=r, N_PER_PROG=per_prog,
            FP4=fmt.fp4, HAS_SMOOTH=prepared.rsmooth is not None, INTERPRETED=interpreted(),
            MASK_N=per_prog * split != n,
            BM=tile.bm, BN=tile.bn, BR=rank_block(r),
            num_warps=tile.num_warps, num_stages=tile.num_stages, enable_fp_fusion=False,
        )
        if part is not lora:
            torch.sum(part, dim=0, out=lora)


def tune_tile(
    kernel: TritonActQuantLora, x: torch.Tensor, prepared: SVDQuantWeights, configs: tuple[Tile, ...] = CONFIGS
) -> list[tuple[Tile, float]]:
    """Time every valid candidate on this GPU (``triton.testing.do_bench``, median);
    returns ``(tile, seconds)`` fastest first. Candidates that fail to compile are left out."""
    from triton.testing import do_bench

    fmt = kernel.fmt
    assert isinstance(fmt, SVDQuantAct)
    results = []
    for tile in configs:
        try:
            check_tile(tile, fmt, prepared.r)
        except KernelInputError:
            continue
        if smem_bytes(tile, prepared.r) > 200 * 1024:  # beyond an H100 block's shared memory
            continue
        try:
            ms = do_bench(lambda t=tile: kernel.forward(x, prepared, tile=t), warmup=10, rep=40, return_mode="median")
        except Exception:  # a configuration out of registers or shared memory on this GPU
            continue
        results.append((tile, float(ms) / 1e3))
    results.sort(key=lambda item: item[1])
    if not results:
        raise KernelInputError(f"{kernel.name}: no tile in CONFIGS runs on {x.device}")
    return results
