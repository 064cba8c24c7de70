"""What the layout tests of the backends over pair-interleaved GPTQ codes (triton_int4,
hopper_wgmma) share: the GPTQ parameterisations every round trip covers, and the bytes a
prepared weight holds beside the checkpoint's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from quantcore.formats.gptq import GPTQ

__all__ = ["BYTES_CASES", "ROUND_TRIP_FORMATS", "prepared_and_stored_bytes"]

#: Symmetric and not, act-order (v1 zero points), one group, 8-bit.
ROUND_TRIP_FORMATS = [
    GPTQ(bits=4, group_size=128),
    GPTQ(bits=4, group_size=32, sym=False),
    GPTQ(bits=4, group_size=64, sym=False, desc_act=True, checkpoint_format="v1"),
    GPTQ(bits=4, group_size=-1, desc_act=True),
    GPTQ(bits=8, group_size=128, sym=False),
    GPTQ(bits=8, group_size=-1),
]

#: (bits, group_size, sym) of the prepared-bytes bound.
BYTES_CASES = [(4, 128, True), (4, 32, False), (8, 128, False), (4, -1, True)]


def prepared_and_stored_bytes(transform: Callable[[GPTQ], Any], bits: int, group_size: int,
                              sym: bool) -> tuple[int, int]:
    """(bytes ``transform(fmt).apply`` keeps, bytes of the checkpoint) for a random
    512 × 1024 weight quantized in ``GPTQ(bits, group_size, sym)``."""
    fmt = GPTQ(bits=bits, group_size=group_size, sym=sym)
    src = fmt.quantize(torch.randn(512, 1024, generator=torch.Generator().manual_seed(0)) * 0.05)
    stored = sum(t.numel() * t.element_size() for t in src.values())
    return transform(fmt).apply(src).nbytes(), stored
