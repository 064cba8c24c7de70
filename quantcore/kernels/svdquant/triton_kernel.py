"""The launcher both Triton registrations share: tiles, the stream-K grid, the workspace.

The kernel (:mod:`.triton_source`) is compiled per format (``FP4``), smooth on/off, N,
R and tile. On CUDA it compiles; on CPU it runs under Triton's interpreter
(``TRITON_INTERPRET=1``) with float32 dot operands; on an Ascend NPU triton-ascend
compiles the same source (no inline PTX there: ``PTX`` is set on CUDA only).

Tiles. A step is one ``bm × bn`` tile of x; ``grid`` programs share the
``(M_pad / bm) · ⌈N / bn⌉`` steps evenly (stream-K; 0 = two programs per SM). ``bm``
trades the LoRA weight's re-reads (each row tile reads all of ``lora_down`` from L2)
against the partials of row tiles split between programs. The tile for a call comes
from, in order: ``QUANTCORE_SVDQUANT_TUNE=1`` (time :data:`CONFIGS` on the shape's first
call, cached in-process); the shipped table for this card or the nearest of its architecture (:mod:`.configs`,
keyed by everything that changes the kernel: format, N, R, M bucket, dtype, smooth); the
:func:`pick_tile` rule.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from ...cost import Cost
from ...errors import KernelInputError
from ...formats.svdquant import SVDQuantAct
from ...kernel import Requirements, Support
from ...ops.act_quant_lora import ActQuantLoraOutput
from ...probe import Capabilities
from ...probe.card_tables import card_of
from ...problem import Problem
from ...triton import TESTED_TRITON
from .base import SVDQuantKernel, SVDQuantWeights, allocate_outputs
from .configs import shipped_tile
from .tile import DEFAULT_TREE, Tile, launch_geometry, rank_block

__all__ = [
    "CONFIGS", "SMEM_BUDGET", "Tile", "TritonActQuantLora", "check_tile", "gpu_math", "interpreted", "launch_geometry",
    "pick_tile", "smem_bytes", "tune_tile",
]

MAX_RANK = 256
ENV_TUNE = "QUANTCORE_SVDQUANT_TUNE"


#: Candidates for :func:`tune_tile` on a GPU. Each compiles for sm_90 without spilling
#: at R ≤ 128 (``python -m tools.compile_report act_quant_lora``); those whose pipelined tiles
#: exceed shared memory for a rank are skipped. The last two fill the SMs at a small batch:
#: the shipped M = 256 tiles launch one or two 4-warp programs an SM where four fit (128
#: registers, 33–37 KB of shared memory each).
CONFIGS = tuple(
    Tile(bm, bn, warps, 3, 0, 1, cap, per_sm)
    for bm, bn, warps, cap, per_sm in [
        (64, 64, 4, None, 2), (64, 64, 4, 168, 3), (64, 64, 4, 128, 4), (64, 128, 4, 168, 3), (128, 64, 8, 128, 2),
        (32, 128, 4, None, 1), (32, 64, 4, 128, 2), (16, 64, 4, 128, 2), (16, 128, 4, 128, 1), (64, 128, 4, None, 1),
        (32, 128, 4, 128, 4), (16, 64, 4, 128, 4),
    ]
)


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def gpu_math() -> bool:
    """Whether the kernel takes the GPU's arithmetic paths (a dot on the loaded dtype, a
    float block max): off under the interpreter (its bf16 dot is wrong, a custom max is
    slow there). Tests turn it on under the interpreter to check those paths."""
    return not interpreted()


def _pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


#: Shared memory a tile's pipelined loads may take: stages × (x tile + lora_down tile),
#: kept under an A100's 164 KiB so the defaults compile on every SM >= 8.0 GPU.
SMEM_BUDGET = 160 * 1024


def smem_bytes(tile: Tile, r: int) -> int:
    """An upper estimate of the shared memory the software pipeline allocates (2-byte
    operands; the LoRA tile only when R > 0)."""
    w = tile.bn * rank_block(r) if r else 0
    return tile.num_stages * (tile.bm * tile.bn + w) * 2


def pick_tile(m_pad: int, n: int, r: int, fp4: bool, *, pad_size: int = 256) -> Tile:
    """The tile of a shape the shipped table does not hold. Under the interpreter: few,
    large programs, one per row tile (it pays per operation, not per element). On a GPU,
    what won most of the H100 sweep: a large batch in 64 × 64 steps, 4 warps, 3 stages,
    three programs per SM under a 168-register cap (two, uncapped, for R > 128); a small
    batch (M_pad ≤ 512) in 32-row steps (16 for R > 64), one program per SM (their LoRA
    partials are few), with fewer stages where the pipelined tiles would exceed
    :data:`SMEM_BUDGET`."""
    block = 16 if fp4 else 64
    # A row tile divides pad_size, so it divides every padded M (a multiple of 16, as
    # supports() requires).
    rows = pad_size & -pad_size
    if interpreted():
        bn = min(256, max(block, _pow2(n)))
        while n % bn and bn > block:
            bn //= 2
        return Tile(min(128, m_pad, rows), bn, 4, 1)
    small = m_pad <= 512
    bm = min((16 if r > 64 else 32) if small else 64, m_pad, rows)
    bn = 128 if small else 64
    cap: int | None
    if small:
        cap, per_sm = 128, 1
    else:
        cap, per_sm = (168, 3) if r <= 128 else (None, 2)
    tile = Tile(bm, bn, 4, 3, 0, DEFAULT_TREE, cap, per_sm)
    for stages in (3, 2, 1):
        tile = Tile(bm, bn, 4, stages, 0, DEFAULT_TREE, cap, per_sm)
        if smem_bytes(tile, r) <= SMEM_BUDGET:
            break
    return tile


def check_tile(tile: Tile, fmt: SVDQuantAct, r: int) -> None:
    problems = []
    if any(v < 16 or v & (v - 1) for v in (tile.bm, tile.bn)):
        problems.append("bm and bn must be powers of two >= 16 (tl.arange, tl.dot)")
    if tile.bn % fmt.block:
        problems.append(f"bn={tile.bn} must be a multiple of the block size {fmt.block}")
    if fmt.pad_size % tile.bm:
        problems.append(f"bm={tile.bm} must divide pad_size={fmt.pad_size}")
    if tile.grid < 0 or tile.per_sm < 1:
        problems.append(f"grid={tile.grid} must be >= 0 and per_sm={tile.per_sm} >= 1")
    if tile.tree not in (0, 1):
        problems.append(f"tree={tile.tree} must be 0 or 1")
    if tile.maxnreg is not None and not 64 <= tile.maxnreg <= 255:
        problems.append(f"maxnreg={tile.maxnreg} must be None or in [64, 255]")
    if tile.red not in (1, 2, 4, 8):
        problems.append(f"red={tile.red} must be 1, 2, 4 or 8")
    if r > MAX_RANK:
        problems.append(f"R={r} > {MAX_RANK}")
    if problems:
        raise KernelInputError(f"tile {tile}: " + "; ".join(problems))


_tuned: dict[tuple[object, ...], Tile] = {}


class TritonActQuantLora(SVDQuantKernel):
    """One Triton source for both formats; subclasses pick the format and devices."""

    fmt: SVDQuantAct  # what prepare() and every call check the prepared state against

    max_rank: ClassVar[int | None] = MAX_RANK
    #: bf16 tl.dot on CUDA; the CPU runs it under Triton's interpreter.
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda", "cpu"}), min_capability=(8, 0), packages=("triton",),
        min_versions=(TESTED_TRITON,)
    )

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
    def supports(cls, problem: Problem) -> Support:
        base = super().supports(problem)
        if not base:
            return base
        fmt = problem.format
        if isinstance(fmt, SVDQuantAct) and fmt.pad_size % 16:
            return Support.no(f"pad_size={fmt.pad_size}: row tiles need a multiple of 16")
        return base

    def __call__(self, x: torch.Tensor, prepared: SVDQuantWeights) -> ActQuantLoraOutput:
        return self._run(x, prepared, self.check_call(x, prepared), None)

    def forward(self, x: torch.Tensor, prepared: SVDQuantWeights, *, tile: Tile | None = None) -> ActQuantLoraOutput:
        """The call without validation (inputs must pass :meth:`check_call`). Everything
        but the outputs and the launch is decided once per bucket (:mod:`.triton_launch`)."""
        return self._run(x, prepared, x.shape[0], tile)

    @functools.cached_property
    def _format_key(self) -> tuple[object, ...]:
        """The format as part of a bucket's key: its type and fields, which hash in C (the
        format's own hash is its dataclass's Python method, a call per lookup)."""
        return (type(self.fmt), *dataclasses.astuple(self.fmt))

    def _run(self, x: torch.Tensor, prepared: SVDQuantWeights, m: int, tile: Tile | None) -> ActQuantLoraOutput:
        """:meth:`forward` of ``x``'s ``m`` rows."""
        if m == 0:
            return ActQuantLoraOutput(*allocate_outputs(self.fmt, 0, x.shape[1], prepared.r, x.device))
        stride = x.stride()
        if stride[1] != 1:
            x = x.contiguous()
            stride = x.stride()
        pad = self.fmt.pad_size
        m_pad = -(-m // pad) * pad  # padded_rows(m, pad), without a Python call per launch
        # Kept with the LoRA tensor (the custom op rebuilds the state object at every call).
        # The tensor fixes the device (x is on it: check_call), so the key leaves it out.
        state = _launcher().launch_state(prepared.lora_down)
        key = (m_pad, x.dtype, tile, self._format_key)
        bucket = state.get(key)
        if bucket is None or bucket.rsmooth is not prepared.rsmooth:
            bucket = state[key] = self._bucket(x, prepared, m_pad, tile)
        return bucket(x, stride[0], m)  # type: ignore[no-any-return]

    def _bucket(self, x: torch.Tensor, prepared: SVDQuantWeights, m_pad: int, tile: Tile | None) -> Any:
        """A new bucket for ``x``'s padded row count, dtype and device (:mod:`.triton_launch`)."""
        fmt = self.fmt
        chosen = tile if tile is not None else self._tile(x, prepared, m_pad)
        check_tile(chosen, fmt, prepared.r)
        compiled = x.device.type == "cuda" and not interpreted()
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if compiled else 1
        return _launcher().Bucket(fmt, prepared, chosen, m_pad, x.dtype, x.device, compiled=compiled,
                                  interpreted=interpreted(), sms=sms, gpu_math=gpu_math())

    def _tile(self, x: torch.Tensor, prepared: SVDQuantWeights, m_pad: int) -> Tile:
        fmt = self.fmt
        assert isinstance(fmt, SVDQuantAct)
        n, r = prepared.n, prepared.r
        if x.device.type == "cuda" and not interpreted():
            smooth = prepared.rsmooth is not None
            if os.environ.get(ENV_TUNE) == "1":
                key = (x.device, fmt.fp4, m_pad, n, r, x.dtype, smooth)
                if key not in _tuned:
                    _tuned[key] = tune_tile(self, x, prepared)[0][0]
                    print(f"{self.name}: tuned {key[1:]} -> {_tuned[key]}", file=sys.stderr)
                return _tuned[key]

            shipped = shipped_tile(card_of(x.device), fmt, m_pad, n, r, x.dtype, smooth)
            if shipped is not None:
                return shipped
        return pick_tile(m_pad, n, r, fmt.fp4, pad_size=fmt.pad_size)


@functools.cache
def _launcher() -> Any:
    """:mod:`.triton_launch`, imported on the first call (it imports triton)."""
    from . import triton_launch

    return triton_launch


def _median_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Median seconds of ``fn()``: ``triton.testing.do_bench`` on a GPU; on a CPU (the
    interpreter, where tuning only checks that every candidate runs) a few timed calls."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=40, return_mode="median")) / 1e3
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tune_tile(
    kernel: TritonActQuantLora, x: torch.Tensor, prepared: SVDQuantWeights, configs: tuple[Tile, ...] = CONFIGS
) -> list[tuple[Tile, float]]:
    """Time every valid candidate on ``x``'s device; returns ``(tile, seconds)`` fastest
    first. Candidates :func:`check_tile` refuses or whose pipelined tiles exceed a block's
    shared memory are left out, and so are those that fail to compile or run (out of
    registers or shared memory on this GPU) — but if none is left, the error names each
    candidate's failure, so a bug in the tuned path cannot pass for a GPU limit."""
    fmt = kernel.fmt
    assert isinstance(fmt, SVDQuantAct)
    results, failures = [], []
    for tile in configs:
        try:
            check_tile(tile, fmt, prepared.r)
        except KernelInputError:
            continue
        if smem_bytes(tile, prepared.r) > 200 * 1024:  # beyond an H100 block's shared memory
            continue
        try:
            seconds = _median_seconds(functools.partial(kernel.forward, x, prepared, tile=tile), x.device)
        except Exception as exc:  # kept for the error below
            failures.append(f"{tile.describe()}: {type(exc).__name__}: {exc}")
            continue
        results.append((tile, seconds))
    results.sort(key=lambda item: item[1])
    if not results:
        why = "; ".join(failures) or "every candidate was refused by check_tile or exceeds shared memory"
        raise KernelInputError(f"{kernel.name}: no tile of {len(configs)} candidates runs on {x.device}: {why}")
    return results
