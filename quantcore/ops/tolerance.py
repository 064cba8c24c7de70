"""The tolerance policy: what error a correct kernel may show, per activation dtype.

The golden output is float64 from the golden dequantization of the same stored tensors
and the same (already rounded) activation. A correct kernel then differs only by
rounding in its own arithmetic: the weight and output rounded to the activation dtype
(each at most one unit roundoff u, about u/√3 as an RMS), plus accumulation error.

``rel``: bound on ‖y − ref‖_F / ‖ref‖_F.
    fp16, bf16: 2u (u = 2^-11 and 2^-8). Measured correct kernels sit near 0.4u;
    accumulating in the activation dtype instead of fp32 grows like √K·u and fails.
    fp32: 1e-5, since blocked fp32 accumulation over K ≤ 16k may reach a few 1e-6.
``max``: bound on max|y − ref| / rms(ref), 8 × rel. A single wrong output column or
    row barely moves the Frobenius ratio of a wide output; this catches it.

Tolerances are never loosened to make a cell pass: a kernel that needs more is wrong
or must document (and test) a different contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Tolerance", "compare", "judge_output", "tolerance_for"]

_UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
_FP32_REL = 1e-5
MAX_FACTOR = 8.0


@dataclass(frozen=True)
class Tolerance:
    rel: float
    max: float


@dataclass(frozen=True)
class Comparison:
    ok: bool
    rel_err: float
    max_err: float
    tolerance: Tolerance
    problem: str = ""


def tolerance_for(dtype: torch.dtype) -> Tolerance:
    if dtype in _UNIT_ROUNDOFF:
        rel = 2 * _UNIT_ROUNDOFF[dtype]
    elif dtype == torch.float32:
        rel = _FP32_REL
    else:
        raise ValueError(f"no tolerance policy for activation dtype {dtype}")
    return Tolerance(rel=rel, max=MAX_FACTOR * rel)


def compare(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> Comparison:
    """Compare a kernel's output with the float64 golden output."""
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(False, float("nan"), float("nan"), tol, f"shape {tuple(out.shape)} != {tuple(ref.shape)}")
    # Both on the CPU in float64: a golden may be computed beside the kernel, on its device.
    o = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    if not torch.isfinite(o).all():
        bad = int((~torch.isfinite(o)).sum())
        return Comparison(False, float("nan"), float("nan"), tol, f"{bad} non-finite output element(s)")
    ref_norm = ref.norm().item()
    if ref.numel() == 0:
        return Comparison(True, 0.0, 0.0, tol)
    diff = o - ref
    denom = ref_norm if ref_norm > 0 else 1.0
    rel = diff.norm().item() / denom
    rms = denom / ref.numel() ** 0.5
    mx = diff.abs().max().item() / rms
    ok = rel <= tol.rel and mx <= tol.max
    why = "" if ok else f"rel {rel:.2e} (tol {tol.rel:.1e}), max {mx:.2e} (tol {tol.max:.1e})"
    return Comparison(ok, rel, mx, tol, why)


def judge_output(output: object, golden: torch.Tensor, act_dtype: torch.dtype) -> Comparison:
    """A kernel's output must be a tensor in the activation dtype within tolerance of the
    float64 golden output (the usual judgement of a harness)."""
    tol = tolerance_for(act_dtype)
    if not isinstance(output, torch.Tensor):
        return Comparison(False, float("nan"), float("nan"), tol, f"returned {type(output).__name__}, not a tensor")
    if output.dtype != act_dtype:
        return Comparison(False, float("nan"), float("nan"), tol, f"output dtype {output.dtype}, expected {act_dtype}")
    return compare(output, golden, tol)
