"""What a call asks of torch: the aten ops it dispatches, by name, in order — what the
host-cost tests of every backend count (each aten op costs the host microseconds on a GPU)."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["AtenOps"]


class AtenOps(TorchDispatchMode):
    """``with AtenOps() as seen: call()`` — ``seen.ops`` lists the aten ops the call ran."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))
