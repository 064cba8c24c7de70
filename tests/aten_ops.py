"""What a call asks of torch: the aten ops it dispatches, by name, in order — what the
host-cost tests of every backend count (each aten op costs the host microseconds on a GPU)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["AtenOps", "ops_of_call"]


class AtenOps(TorchDispatchMode):
    """``with AtenOps() as seen: call()`` — ``seen.ops`` lists the aten ops the call ran."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def ops_of_call(call: Callable[[], object], *, warm_ups: int = 1,
                mode: AbstractContextManager[Any] | None = None) -> Counter[str]:
    """The aten ops of one ``call`` after ``warm_ups`` calls (the bucket made and bound),
    all under ``mode`` (``torch.no_grad()`` unless given)."""
    import torch

    with mode if mode is not None else torch.no_grad():
        for _ in range(warm_ups):
            call()
        with AtenOps() as counted:
            call()
    return Counter(counted.ops)
