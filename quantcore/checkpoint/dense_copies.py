"""Saying so when a quantized layer holds its weight dense: one warning per model,
wherever a model is quantized or loaded (``quantize_``, ``load_quantized``, the Hugging
Face path).

A layer whose bound kernel keeps a dense copy (``Kernel.keeps_dense_weight``: the
dequantize-then-matmul fallback, chosen when nothing that keeps the weight compressed can
run that format on that device — GPTQ 8-bit on a CPU, say) costs as much memory as the
unquantized layer or more; the user asked for a quantized model and should know.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from torch import nn

from ..errors import QuantCoreWarning

__all__ = ["dense_copies", "warn_dense_copies"]

SHOWN = 5


def dense_copies(layers: Iterable[tuple[str, nn.Module]]) -> dict[str, tuple[str, int]]:
    """``{layer: (kernel, bytes held)}`` for every quantized layer whose kernel keeps a
    dense copy of the weight."""
    from ..nn.quant_module import QuantModule

    found = {}
    for name, module in layers:
        if isinstance(module, QuantModule) and module.kernel is not None and type(module.kernel).keeps_dense_weight:
            found[name] = (module.kernel.name, sum(t.nbytes for t in module.state_tensors()))
    return found


def warn_dense_copies(layers: Iterable[tuple[str, nn.Module]], where: str, *, stacklevel: int = 3) -> None:
    """One :class:`~quantcore.errors.QuantCoreWarning` naming every layer of ``layers``
    that holds a dense copy, with the bytes it holds; nothing when none does."""
    layers = list(layers)
    found = dense_copies(layers)
    if not found:
        return
    quantized = sum(1 for _, m in layers if getattr(m, "kernel", None) is not None)
    total = sum(b for _, b in found.values())
    kernels = ", ".join(sorted({k for k, _ in found.values()}))
    listed = "; ".join(f"{n} ({b:,} bytes)" for n, (_, b) in list(found.items())[:SHOWN])
    more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    warnings.warn(
        f"{where}: {len(found)} of {quantized} quantized layers keep a dense copy of their weight ({kernels}: no "
        f"kernel that keeps it compressed can run them here), {total:,} bytes in all: {listed}{more}",
        QuantCoreWarning, stacklevel=stacklevel,
    )
