"""What a kernel declares about its speed, so that the untuned default is the fastest
kernel for the shape.

A kernel's :meth:`~quantcore.kernel.Kernel.cost` returns a :class:`Cost` for one problem on
one device: the bytes the call must move and the flops it must do, and the share of the
device's copy bandwidth and of its dense-matmul rate the kernel reaches there — a roofline
with the kernel's own efficiencies, plus a fixed cost per launch. A kernel whose stream is
latency-bound also declares the bytes per second its own pipeline sustains: a card with
faster memory does not raise that rate, so there the kernel reaches a smaller share of the
copy bandwidth (the int4 kernels take the same time at M = 1 on the H100 and on the H200,
whose copy bandwidth is 1.4× the H100's). The shares are the
"of copy BW" and "of matmul" columns of ``quantcore bench``, so a kernel's author reads them
off a benchmark run. The shape moves the choice through the roofline: a kernel that streams
its weight at 60 % of the bandwidth but multiplies at 4 % of the matmul rate wins at M = 1
and loses from the M where its flops, not its bytes, bound it.

``Cost.seconds(rates)`` is the estimate on a device whose :class:`DeviceRates` are known
(:func:`device_rates`). Only the kernels' estimates relative to each other decide, so the
rates need to be about right in proportion (bandwidth against matmul rate), not exact.
Measured times (``tune=True``, the cached and shipped tables of
:mod:`quantcore.measured`) replace the estimates wherever they exist.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .probe import Capabilities
from .problem import Problem

__all__ = [
    "BATCH_SIZES",
    "Cost",
    "DeviceRates",
    "batch_dim",
    "column_fill",
    "device_rates",
    "grouped_weight_bytes",
    "linear_cost",
    "shape_class",
    "weight_fill",
    "with_batch",
]

#: The dim that grows with the batch, per op (``M`` unless listed): the dim the choice
#: moves with, and the one shape classes round up to a power of two.
_BATCH_DIMS = {"moe": "T"}
#: The batch sizes ``explain`` sweeps, and over which a problem without one is judged.
BATCH_SIZES = tuple(1 << i for i in range(13))  # 1 … 4096


def batch_dim(problem: Problem) -> str:
    return _BATCH_DIMS.get(problem.op, "M")


def with_batch(problem: Problem, size: int) -> Problem:
    """``problem`` with its batch dim set to ``size``."""
    dims = dict(problem.dims)
    dims[batch_dim(problem)] = size
    return replace(problem, dims=tuple(dims.items()))


def shape_class(problem: Problem) -> str:
    """Exact dims, the batch dim rounded up to a power of two: ``K4096-M32-N4096``."""
    dims = dict(problem.dims)
    b = batch_dim(problem)
    if b in dims:
        dims[b] = 1 << max(0, (dims[b] - 1).bit_length())
    return "-".join(f"{k}{v}" for k, v in sorted(dims.items()))


@dataclass(frozen=True)
class DeviceRates:
    """What the estimate needs of a device. ``source`` says where the numbers come from."""

    copy_bytes_per_s: float
    matmul_flops_per_s: float
    launch_s: float
    source: str


#: Rates measured by ``quantcore bench`` (its ceilings), by device name.
_MEASURED = {
    "NVIDIA H100 80GB HBM3": DeviceRates(
        3.00e12, 6.86e14, 2.0e-6, "measured: benchmarks/results/nvidia-h100-80gb-hbm3 (copy, bf16 8192³ matmul)"),
    "NVIDIA H200": DeviceRates(
        4.24e12, 7.13e14, 2.0e-6, "measured: benchmarks/results/nvidia-h200 (copy, bf16 8192³ matmul)"),
}
#: Nominal rates by device type, for devices nobody has measured: balanced like the
#: measured ones of their kind (a CPU: the 2-thread AMD EPYC of benchmarks/results/amd-epyc).
_NOMINAL = {
    "cpu": DeviceRates(4.0e10, 3.6e11, 2.0e-5, "nominal for a CPU (the AMD EPYC in benchmarks/results)"),
    "cuda": DeviceRates(2.0e12, 3.0e14, 3.0e-6, "nominal for a CUDA GPU"),
    "xpu": DeviceRates(1.0e12, 1.0e14, 5.0e-6, "nominal for an XPU"),
    "npu": DeviceRates(1.0e12, 2.0e14, 5.0e-6, "nominal for an NPU"),
}


def device_rates(caps: Capabilities) -> DeviceRates:
    """The device's rates: measured for devices the project has run on, else nominal."""
    return _MEASURED.get(caps.name) or _NOMINAL.get(caps.device_type) or _NOMINAL["cuda"]


@dataclass(frozen=True)
class Cost:
    """A kernel's estimate for one call: a roofline with its own efficiencies.

    ``bandwidth`` is the share of the device's copy bandwidth (read + write) the kernel
    reaches while memory-bound, ``compute`` its share of the dense bf16 matmul rate while
    compute-bound; ``launches`` fixed launch costs are added. ``stream_bytes_per_s`` caps
    the memory-bound rate where the stream is latency-bound (the bytes each SM keeps in
    flight over the DRAM latency, or a chain of dependent steps per block of codes): a
    rate in bytes per second, not a share, because a faster memory does not raise it.
    ``note`` says what the numbers rest on (shown by ``explain``)."""

    bytes: float
    flops: float
    bandwidth: float
    compute: float
    launches: int = 1
    note: str = ""
    stream_bytes_per_s: float = math.inf

    def __post_init__(self) -> None:
        for name in ("bandwidth", "compute"):
            share = getattr(self, name)
            if not (isinstance(share, (int, float)) and share > 0 and math.isfinite(share)):
                raise ValueError(f"Cost.{name}: expected a share > 0, got {share!r}")
        if not (isinstance(self.stream_bytes_per_s, (int, float)) and self.stream_bytes_per_s > 0):
            raise ValueError(f"Cost.stream_bytes_per_s: expected a rate > 0, got {self.stream_bytes_per_s!r}")
        if self.bytes < 0 or self.flops < 0 or self.launches < 0:
            raise ValueError(f"Cost: bytes, flops and launches must be >= 0, got {self.bytes}, {self.flops}, {self.launches}")

    def memory_s(self, rates: DeviceRates) -> float:
        return self.bytes / min(rates.copy_bytes_per_s * self.bandwidth, self.stream_bytes_per_s)

    def compute_s(self, rates: DeviceRates) -> float:
        return self.flops / (rates.matmul_flops_per_s * self.compute)

    def seconds(self, rates: DeviceRates) -> float:
        return self.launches * rates.launch_s + max(self.memory_s(rates), self.compute_s(rates))

    def bound(self, rates: DeviceRates) -> str:
        """What bounds the estimate: ``"memory"``, ``"compute"`` or ``"launch"``."""
        memory, compute = self.memory_s(rates), self.compute_s(rates)
        if self.launches * rates.launch_s > max(memory, compute):
            return "launch"
        return "memory" if memory >= compute else "compute"


def column_fill(n: int, full: int = 4096) -> float:
    """The share of a tiled GEMM's compute rate left where ``N`` is below ``full``: a row
    of output tiles holds too few column tiles to fill the SMs, and the K split that fills
    them writes and re-reads its partials. Fit to ``hopper_wgmma`` at N = 1024 and M = 512,
    about half its rate at N = 4096 on both cards
    (``benchmarks/results/nvidia-h100-80gb-hbm3/gptq_linear.json``,
    ``benchmarks/results/nvidia-h200/gptq_linear.json``)."""
    return float(min(1.0, n / full) ** 0.5)


def weight_fill(k: int, n: int, full: int = 4096 * 14336) -> float:
    """The share of a split-K GEMM's compute rate left at one row of output tiles (M up to
    a tile) where the weight holds fewer than ``full`` inputs × outputs: the tiles and K
    splits that fill the SMs each walk fewer blocks, so the pipeline's fill and the partial
    sums weigh more. Fit to ``hopper_wgmma`` at M = 128, the same on both cards (of the
    matmul rate, past its launch: 0.80–0.84, 0.60, 0.40–0.42 and 0.13 at 4096×14336,
    14336×4096, 4096×4096 and 4096×1024; ``benchmarks/results/nvidia-h100-80gb-hbm3/gptq_linear.json``,
    ``benchmarks/results/nvidia-h200/gptq_linear.json``)."""
    return float(min(1.0, k * n / full) ** 0.5)


def grouped_weight_bytes(k: int, n: int, bits: float, group_size: int, *, scale_bytes: int = 2,
                         zero_bits: float = 0) -> float:
    """A group-quantized ``[K, N]`` weight: codes, one scale (and zero) per group and column."""
    groups = -(-k // group_size) if group_size > 0 else 1
    return k * n * bits / 8 + groups * n * (scale_bytes + zero_bits / 8)


def linear_cost(problem: Problem, weight_bytes: float, *, bandwidth: float, compute: float,
                launches: int = 1, note: str = "", stream_bytes_per_s: float = math.inf) -> Cost:
    """A linear's cost: the weight read once, x read and y written once, 2·M·K·N flops."""
    m, k, n = problem["M"], problem["K"], problem["N"]
    act = problem.act_dtype.itemsize
    return Cost(weight_bytes + act * (m * k + m * n), 2 * m * k * n, bandwidth, compute, launches, note,
                stream_bytes_per_s)
