"""svdquant_prequant: the SVDQuant W4A4 pre-GEMM (op ``act_quant_lora``) at the
format's target shapes (docs/formats/svdquant.md: ZImage Turbo at 1024², M = 4352; N ∈ {3840, 10240}; R ∈ {32,
128}) and the same at a small batch (M = 256), smooth on, bf16, NVFP4 and INT4.

Variants, timed in the same run:

- every registered kernel that can run here except the plain-torch one (role kernel):
  ``triton_nvfp4`` / ``triton_ascend_int4`` on CUDA, called through ``forward`` (no
  argument checks), with the tile a caller gets (on an H100 the shipped one);
- ``cublas_lora_down`` (peer): ``x @ lora_down`` alone, bf16 out, cuBLAS — the matmul
  the fused kernel hides its quantize behind (specs: "the real peer");
- ``svdquant_torch`` (peer, ``--shapes unfused`` only: it is ~25× slower and would
  dominate the run): the unfused path — torch's element-wise quantize passes and a
  separate cuBLAS LoRA-down (fp32 accumulate and output).

Bytes are each variant's fewest: x read once, lora_down (and 1/smooth, float32) read,
codes, scales and the float32 LoRA output written (M padded to 256); the cuBLAS peer
reads x and lora_down and writes a bf16 [M, R]. Inputs rotate over enough sets to be
twice the L2 together, also at M = 256 (so the small batch reads x from HBM too).
Targets: the fused kernel at ≥ 80 % of the measured copy bandwidth at M =
4352 (≥ 1.0× cuBLAS LoRA-down alone) and ≥ 60 % at M = 256.

On CUDA each Triton kernel is also timed as ``<name>+tuned`` with the fastest of its
``CONFIGS`` for the shape (timed first; ``QUANTCORE_SVDQUANT_TUNE=0`` skips it).
``QUANTCORE_SVDQUANT_TUNE=1`` makes the kernels themselves tune on each shape's first
call; ``python -m tools.probes.act_quant_lora_tiles`` (from the repository root) times the
whole candidate grid.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch

from quantcore.formats.svdquant import SVDQuantAct
from quantcore.ops.act_quant_lora import act_quant_lora_problem
from quantcore.registry import default_registry
from quantcore.selection import explain

from ..choice import default_choice
from ..memory import rotation_sets
from ..spec import BenchCase, Role, Variant

DESCRIPTION = "SVDQuant pre-GEMM (NVFP4/INT4 quantize + LoRA-down): fused Triton vs unfused torch vs cuBLAS"
DTYPE = torch.bfloat16
ENV_TUNE = "QUANTCORE_SVDQUANT_TUNE"
TORCH_KERNEL = "svdquant_torch"
_SEED = [{"M": 4352, "N": n, "R": r} for n, r in itertools.product((3840, 10240), (32, 128))]
_BATCH = [{**s, "M": 256} for s in _SEED]
SHAPES = {
    "default": _SEED + _BATCH,
    "nvfp4": [{**s, "fp4": 1} for s in _SEED + _BATCH],
    "int4": [{**s, "fp4": 0} for s in _SEED + _BATCH],
    "unfused": [{**s, "unfused": 1} for s in _SEED],
    "small": [{"M": 256, "N": 256, "R": 32}],
}
#: Rotating input sets allowed per case: enough for M = 256 to exceed the L2 twice.
MAX_SETS = 64


def op_bytes(fmt: SVDQuantAct, m: int, n: int, r: int, smooth: bool = True) -> int:
    """The fewest bytes one call moves (bf16 x)."""
    m_pad = fmt.padded_rows(m)
    scale_bytes = 1 if fmt.fp4 else 2
    return (2 * m * n + 2 * n * r + (4 * n if smooth else 0)
            + m_pad * n // 2 + m_pad * (n // fmt.block) * scale_bytes + 4 * m_pad * r)


def problems(shapes: list[dict[str, int]]) -> list[Any]:
    """The problems the suite's cases time (``quantcore tune --suite``)."""
    out = []
    for dims in shapes:
        for fp4 in ((bool(dims["fp4"]),) if "fp4" in dims else (True, False)):
            out.append(act_quant_lora_problem(SVDQuantAct(fp4=fp4), M=dims["M"], N=dims["N"], R=dims["R"], dtype=DTYPE))
    return out


def _layer(n: int, r: int, dev: torch.device, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "lora_down": (torch.randn(n, r, generator=gen) * 0.05).to(dev, DTYPE),
        "smooth": torch.exp(torch.randn(n, generator=gen) * 0.5).to(dev, DTYPE),
    }


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    reg = default_registry()
    for dims in shapes:
        m, n, r = dims["M"], dims["N"], dims["R"]
        fp4s = (bool(dims["fp4"]),) if "fp4" in dims else (True, False)
        sets = rotation_sets(2 * m * n, device, cap=MAX_SETS)
        xs = [(torch.randn(m, n, generator=gen) * 2).to(dev, DTYPE) for _ in range(sets)]
        layer = _layer(n, r, dev, gen)
        flops = 2 * m * n * r
        for fp4 in fp4s:
            fmt = SVDQuantAct(fp4=fp4)
            tag = "nvfp4" if fp4 else "int4"
            case = BenchCase("svdquant_prequant", f"{tag}-M{m}-N{n}-R{r}", {"M": m, "N": n, "R": r, "fp4": int(fp4)})
            nbytes = op_bytes(fmt, m, n, r)
            problem = act_quant_lora_problem(fmt, M=m, N=n, R=r, dtype=DTYPE)
            chosen = default_choice(fmt, device, problem)
            for cand in explain(fmt, device, problem=problem).candidates:
                if cand.kernel == TORCH_KERNEL and not dims.get("unfused") and dev.type == "cuda":
                    case.skipped[cand.kernel] = "the unfused peer runs with --shapes unfused"
                    continue
                if cand.status not in ("selected", "usable"):
                    if cand.status != "broken":
                        case.skipped[cand.kernel] = f"{cand.status}: {cand.reason}"
                    continue
                kernel = reg.kernel(fmt.name, "act_quant_lora", cand.kernel).cls(fmt, dev)
                prepared = kernel.prepare(layer, dtype=DTYPE)
                call = cast(Callable[..., Any], getattr(kernel, "forward", kernel))
                role: Role = "peer" if cand.kernel == TORCH_KERNEL else "kernel"
                mm = "cuBLAS" if dev.type == "cuda" else "torch"
                note = f"unfused: torch quantize + {mm} LoRA-down" if role == "peer" else ""
                case.variants.append(Variant(cand.kernel, role, _call(call, xs, prepared), nbytes, flops, sets, note,
                                             candidate=fmt.slug, keeps_dense=cand.keeps_dense,
                                             chosen=cand.kernel == chosen))
                if role == "kernel" and dev.type == "cuda" and os.environ.get(ENV_TUNE) != "0":
                    try:
                        case.variants.append(_tuned_variant(kernel, xs, prepared, nbytes, flops, sets))
                    except Exception as exc:  # shown, not hidden
                        case.skipped[f"{cand.kernel}+tuned"] = f"tuning failed: {type(exc).__name__}: {exc}"
            case.variants.append(Variant(
                "cublas_lora_down", "peer", _matmul(xs, layer["lora_down"]),
                2 * m * n + 2 * n * r + 2 * m * r, flops, sets, "cuBLAS" if dev.type == "cuda" else "torch.matmul",
            ))
            yield case


def _tuned_variant(kernel: Any, xs: list[torch.Tensor], prepared: Any, nbytes: int, flops: int, sets: int,
                   configs: tuple[Any, ...] | None = None) -> Variant:
    """The same kernel with the fastest tile of ``configs`` (default ``CONFIGS``) for this
    shape, timed here."""
    from quantcore.kernels.svdquant.triton_kernel import CONFIGS, tune_tile

    best, _ = tune_tile(kernel, xs[0], prepared, CONFIGS if configs is None else configs)[0]
    note = f"tuned tile: {best.describe()}"
    return Variant(f"{kernel.name}+tuned", "kernel", lambda i: kernel.forward(xs[i % len(xs)], prepared, tile=best),
                   nbytes, flops, sets, note)


def _matmul(xs: list[torch.Tensor], w: torch.Tensor) -> Callable[[int], Any]:
    return lambda i: xs[i % len(xs)] @ w


def _call(call: Callable[..., Any], xs: list[torch.Tensor], prepared: Any) -> Callable[[int], Any]:
    return lambda i: call(xs[i % len(xs)], prepared)


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    """The targets for each fused Triton row: ≥ 80 % of copy at M = 4352 (and ≥ 1.0×
    cuBLAS LoRA-down alone), ≥ 60 % at a small batch."""
    notes = []
    for row in rows:
        if row["role"] != "kernel":
            continue
        cublas = row["speedup_vs"].get("cublas_lora_down")
        unfused = row["speedup_vs"].get(TORCH_KERNEL)
        small = row["dims"]["M"] <= 256
        target = 0.6 if small else 0.8
        ok = row["copy_share"] >= target and (small or cublas is None or cublas >= 1.0)
        extra = f", {cublas:.2f}× cuBLAS LoRA-down alone" if cublas is not None else ""
        extra += f", {unfused:.2f}× unfused" if unfused is not None else ""
        goal = f"≥ {target:.0%} of copy" + ("" if small else ", ≥ 1.0× cuBLAS")
        notes.append(f"{row['case']} {row['variant']}: {row['copy_share']:.0%} of copy{extra} "
                     f"(target {goal}): {'met' if ok else 'missed'}")
    return notes

