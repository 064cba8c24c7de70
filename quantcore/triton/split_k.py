"""The buffers of a deterministic split-K launch: an fp32 workspace for the programs'
partials, and the arrival counters the last program of a tile reads (int32, zero between
launches: that program resets its own), kept with the weight.

The workspace is written and read within one launch, so on CUDA one kept buffer per
device and stream serves every split-K launch there (launches on one stream run in order;
a programmatic-dependent launch waits for the grid before it before it writes anything),
and a call allocates none. Elsewhere (Triton's interpreter on a CPU, where two threads may
run launches at once) a call makes its own.

The kernels that use it (``triton_int4``, ``hopper_wgmma``) take the workspace and the
counters as two pointer arguments; a launch that does not split K passes any tensor of
the weight's in their place (the kernel never reads them). No triton import.
"""

from __future__ import annotations

from collections.abc import Hashable, MutableMapping

import torch

from .buffers import KeptBuffers, capturing, grown, stream_key

__all__ = ["SplitKBuffers", "split_k_counters"]

_WORKSPACES = KeptBuffers(torch.float32, zero=False)


def split_k_counters(runtime: MutableMapping[Hashable, torch.Tensor], tiles: int,
                     device: torch.device) -> torch.Tensor:
    """At least ``tiles`` arrival counters on ``device``, kept in the prepared state's
    ``runtime`` dict (grown on demand, :func:`.buffers.grown`)."""
    return grown(runtime, ("counters", device), tiles, torch.int32, device, zero=True, minimum=1024)


class SplitKBuffers:
    """One bound launch's split-K buffers: ``split`` programs along K on ``device``;
    ``unused`` stands in for both when K is not split."""

    def __init__(self, split: int, device: torch.device, unused: torch.Tensor) -> None:
        self.split, self.device, self.unused = split, device, unused
        #: The counters last handed out (not while a graph was captured: those are that graph's).
        self.counters: torch.Tensor | None = None
        #: Per stream, the kept workspace last handed out there (CUDA).
        self._workspaces: dict[Hashable, torch.Tensor] = {}

    def __call__(self, runtime: MutableMapping[Hashable, torch.Tensor], m: int, n: int,
                 tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(workspace, counters)`` for a launch of ``tiles`` output tiles of ``m × n``."""
        if self.split <= 1:
            return self.unused, self.unused
        ws = self._workspace(self.split * m * n)
        counters = self.counters
        if counters is None or counters.numel() < tiles:
            counters = split_k_counters(runtime, tiles, self.device)
            if not capturing(self.device):  # a buffer made during a capture is that graph's alone
                self.counters = counters
        return ws, counters

    def _workspace(self, numel: int) -> torch.Tensor:
        """At least ``numel`` fp32 elements: on CUDA the current stream's kept buffer (one a
        larger launch outgrew stays valid for this one: outgrown buffers are retired, never
        freed), remembered per stream unless a graph is being captured; else a new one."""
        if self.device.type != "cuda":
            return torch.empty(numel, dtype=torch.float32, device=self.device)
        stream = stream_key(self.device)
        ws = self._workspaces.get(stream)
        if ws is None or ws.numel() < numel:
            ws = _WORKSPACES.get(stream, numel, self.device)
            if not capturing(self.device):
                self._workspaces[stream] = ws
        return ws
