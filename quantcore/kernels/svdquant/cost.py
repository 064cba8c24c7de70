"""What one SVDQuant pre-GEMM call moves (``act_quant_lora``), for the kernels' declared
costs (:mod:`quantcore.cost`): x read once, ``lora_down`` (and the float32 1/smooth) read,
the codes, scales and float32 LoRA output written (M padded)."""

from __future__ import annotations

from ...formats.svdquant import SVDQuantAct
from ...problem import Problem

__all__ = ["op_bytes", "op_flops"]


def op_bytes(problem: Problem) -> float:
    fmt = problem.format
    m, n, r = problem["M"], problem["N"], problem["R"]
    act = problem.act_dtype.itemsize
    if not isinstance(fmt, SVDQuantAct):
        return act * m * n
    m_pad = fmt.padded_rows(m)
    scale_bytes = 1 if fmt.fp4 else 2
    return (act * m * n + act * n * r + 4 * n + m_pad * n // 2 + m_pad * (n // fmt.block) * scale_bytes
            + 4 * m_pad * r)


def op_flops(problem: Problem) -> float:
    return 2 * problem["M"] * problem["N"] * problem["R"]
