"""The buffers of a deterministic split-K launch: an fp32 workspace for the programs'
partials, and the arrival counters the last program of a tile reads (int32, zero between
launches: that program resets its own).

Both are written and read within one launch, so on CUDA one kept pair per device and
stream serves every split-K launch there (launches on one stream run in order; a
programmatic-dependent launch waits for the grid before it before it touches either), and
a call allocates neither. Two streams never share them: the same layer run on two streams
at once (two micro-batches overlapped) must not count its tiles' arrivals together. A graph
being captured gets its own pair, zeroed once (:func:`.buffers.grown`). Elsewhere (Triton's
interpreter on a CPU, where two threads may run launches at once) a call makes its own.

The kernels that use them (``triton_int4``, ``hopper_wgmma``) take the workspace and the
counters as two pointer arguments; a launch that does not split K passes any tensor of
the weight's in their place (the kernel never reads them). No triton import.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from .buffers import KeptBuffers, capturing, stream_key

__all__ = ["SplitKBuffers", "keeps_buffers"]

#: Both only grow, and an outgrown buffer is never freed (a captured graph may use it): they
#: double, so a stream whose calls grow one row at a time retires a few buffers, not one a row.
_WORKSPACES = KeptBuffers(torch.float32, zero=False, minimum=1 << 16, doubling=True)
_COUNTERS = KeptBuffers(torch.int32, zero=True, minimum=1024, doubling=True)


def keeps_buffers(device: torch.device) -> bool:
    """Whether launches on ``device`` take the kept per-stream buffers (CUDA)."""
    return device.type == "cuda"


class SplitKBuffers:
    """One bound launch's split-K buffers: ``split`` programs along K on ``device``;
    ``unused`` stands in for both when K is not split, unless ``always`` (a launch whose
    tiles meet in the workspace whatever the split: ``gluon_split_k.py``'s gated end)."""

    def __init__(self, split: int, device: torch.device, unused: torch.Tensor, *, always: bool = False) -> None:
        self.split, self.device, self.unused, self.always = split, device, unused, always
        self.keeps = keeps_buffers(device)
        #: Per stream, the kept pair last handed out there (not while a graph was captured:
        #: those are that graph's).
        self._kept: dict[Hashable, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, m: int, n: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(workspace, counters)`` for a launch of ``tiles`` output tiles of ``m × n``:
        at least ``split · m · n`` fp32 elements and ``tiles`` zeroed int32 counters."""
        if self.split <= 1 and not self.always:
            return self.unused, self.unused
        numel = max(1, self.split) * m * n
        if not self.keeps:
            return (torch.empty(numel, dtype=torch.float32, device=self.device),
                    torch.zeros(tiles, dtype=torch.int32, device=self.device))
        stream = stream_key(self.device)
        hit = self._kept.get(stream)
        if hit is None or hit[0].numel() < numel or hit[1].numel() < tiles:
            # One a larger launch outgrew stays valid for this one: outgrown buffers are
            # retired, never freed, and hold what this launch needs.
            hit = _WORKSPACES.get(stream, numel, self.device), _COUNTERS.get(stream, tiles, self.device)
            if not capturing(self.device):
                self._kept[stream] = hit
        return hit
