"""A stand-in for torch's symmetric memory on the CPU (quantcore/checkpoint/allreduce.py's
``SymmetricMemory``): what the all-reduce tests drive the one-shot path through."""

from __future__ import annotations

import torch

from quantcore.checkpoint.allreduce import SymmetricMemory

__all__ = ["FakeSymm"]


class FakeSymm(SymmetricMemory):
    """Symmetric memory on the CPU for one rank of ``world`` whose peers all hold the same
    partial output: the one-shot sum is ``world`` times it. ``peers_ok`` is what the other
    ranks report to the agreement; ``fail`` makes this rank's rendezvous raise."""

    def __init__(self, world: int = 2, peers_ok: bool = True, fail: bool = False) -> None:
        self.world, self.peers_ok, self.fail = world, peers_ok, fail
        self.made: list[torch.Tensor] = []
        self.agreed: list[bool] = []
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.bound: list[object] = []

    def unavailable(self) -> str:
        return ""

    def empty(self, numel, dtype, device):
        t = torch.empty(numel, dtype=dtype, device=device)
        self.made.append(t)
        return t

    def rendezvous(self, buffer, group):
        if self.fail:
            raise RuntimeError("no peer access")
        return object()

    def agree(self, ok, device, group):
        self.agreed.append(ok)
        return ok and self.peers_ok

    def bind_one_shot(self, group):
        self.bound.append(group)
        return self._one_shot

    def _one_shot(self, buffer, src, *, out):
        assert buffer.shape == src.shape and buffer.untyped_storage().data_ptr() in {
            b.untyped_storage().data_ptr() for b in self.made}
        assert src.is_contiguous() and src.storage_offset() == 0
        self.calls.append((buffer, src))
        buffer.copy_(src)
        out.copy_(buffer * self.world)
