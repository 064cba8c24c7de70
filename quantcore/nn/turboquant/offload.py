"""CPU offload of pass 2: pinned host memory, two GPU scratch slots, a copy stream.

When GPU memory is short, the residual pass's data (indices, scales, rotation — about
half of a layer's quantized bytes) stays in pinned host memory and is copied into one
of two GPU scratch slots shared by every offloaded layer, one layer ahead of use. Per
layer, the seed's prefetch chain (seeds/turboquant-inference-pipeline.md):

1. fence: record an event on the compute stream; the copy stream waits for it, so a
   slot is never overwritten while a kernel queued earlier may still read it;
2. async H2D of the *next* layer's pass-2 data into the other slot, on the copy stream;
3. pass 1 of this layer on the compute stream, overlapping that copy;
4. the compute stream waits for this layer's copy (issued by the previous layer);
5. pass 2 from the slot.

The chain is the order in which offloaded layers first run (their execution order);
the last layer prefetches the first, so a decode loop stays pipelined across steps.
A layer whose data is not in a slot when it runs (the first forward, or calls out of
chain order) loads it itself: slower, never wrong. Data in a slot are the same bytes
as the resident copy, and kernels read them through the same ``run_pass``, so outputs
are identical to the resident path.

On a CPU device the same logic runs with synchronous copies and no streams (tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...transforms.turboquant_passes import PassData

__all__ = ["OffloadedPass", "Pass2OffloadPool", "pin"]


def pin(t: torch.Tensor) -> torch.Tensor:
    """``t`` in pinned host memory when a CUDA runtime can pin it, else on the CPU as is."""
    t = t.detach().to("cpu")
    if torch.cuda.is_available() and not t.is_pinned():
        return t.pin_memory()
    return t


@dataclass(eq=False)
class OffloadedPass:
    """One layer's pass 2 in host memory, in its kernel's layout."""

    host: PassData
    name: str = ""
    position: int = -1  # in the pool's chain


@dataclass(eq=False)
class _Slot:
    buffers: dict[tuple[str, torch.dtype], torch.Tensor] = field(default_factory=dict)
    owner: OffloadedPass | None = None
    ready: torch.cuda.Event | None = None  # the copy into this slot has finished

    def view(self, entry: OffloadedPass) -> PassData:
        return entry.host.map_named(
            lambda name, t: self.buffers[(name, t.dtype)][: t.numel()].view(t.shape)
        )


class Pass2OffloadPool:
    """Two scratch slots and a copy stream, shared by every offloaded layer of a model."""

    SLOTS = 2

    def __init__(self) -> None:
        self.chain: list[OffloadedPass] = []
        self.device: torch.device | None = None
        self._slots = [_Slot() for _ in range(self.SLOTS)]
        self._copy_stream: torch.cuda.Stream | None = None
        #: H2D copies issued (tests and benchmarks read it).
        self.copies = 0

    # --- registration ----------------------------------------------------------------------

    def register(self, entry: OffloadedPass, device: torch.device) -> None:
        """Append ``entry`` to the chain (the order layers first run) and size the slots."""
        if self.device is None:
            self.device = device
            if device.type == "cuda":
                self._copy_stream = torch.cuda.Stream(device)
        elif device != self.device:
            raise ValueError(f"offload pool serves {self.device}, not {device}")
        entry.position = len(self.chain)
        self.chain.append(entry)
        self._reserve(entry)

    def _reserve(self, entry: OffloadedPass) -> None:
        grow = any(
            (key := (name, t.dtype)) not in slot.buffers or slot.buffers[key].numel() < t.numel()
            for slot in self._slots
            for name, t in entry.host.tensors().items()
        )
        if not grow:
            return
        self.synchronize()  # nothing may still be copying into the buffers we replace
        for slot in self._slots:
            for name, t in entry.host.tensors().items():
                key = (name, t.dtype)
                old = slot.buffers.get(key)
                if old is None or old.numel() < t.numel():
                    slot.buffers[key] = torch.empty(t.numel(), dtype=t.dtype, device=self.device)
            slot.owner = None  # contents no longer trusted after a resize

    # --- the prefetch chain ----------------------------------------------------------------

    def begin(self, entry: OffloadedPass) -> _Slot:
        """Steps 1-2 for the layer about to run: make sure its own data is in (or on its way
        to) a slot, then fence and prefetch the next layer's into the other slot."""
        slot = self._holding(entry)
        if slot is None:
            slot = self._free_slot(avoid=None)
            self._load(entry, slot)
        nxt = self.chain[(entry.position + 1) % len(self.chain)]
        if nxt is not entry and self._holding(nxt) is None:
            self._load(nxt, self._free_slot(avoid=slot))
        return slot

    def wait(self, slot: _Slot, entry: OffloadedPass) -> PassData:
        """Step 4: the compute stream waits for the copy into ``slot``; returns the views."""
        if slot.owner is not entry:
            raise RuntimeError(f"offload slot holds {getattr(slot.owner, 'name', None)!r}, not {entry.name!r}")
        if slot.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(slot.ready)
        return slot.view(entry)

    def synchronize(self) -> None:
        if self._copy_stream is not None:
            self._copy_stream.synchronize()

    def _holding(self, entry: OffloadedPass) -> _Slot | None:
        return next((s for s in self._slots if s.owner is entry), None)

    def _free_slot(self, avoid: _Slot | None) -> _Slot:
        return next(s for s in self._slots if s is not avoid)

    def _load(self, entry: OffloadedPass, slot: _Slot) -> None:
        slot.owner = entry
        self.copies += 1
        views = slot.view(entry).tensors()
        if self._copy_stream is None:
            for name, src in entry.host.tensors().items():
                views[name].copy_(src)
            slot.ready = None
            return
        compute = torch.cuda.current_stream(self.device)
        fence = torch.cuda.Event()
        fence.record(compute)  # step 1
        with torch.cuda.stream(self._copy_stream):
            self._copy_stream.wait_event(fence)
            for name, src in entry.host.tensors().items():  # step 2
                views[name].copy_(src, non_blocking=True)
            slot.ready = torch.cuda.Event()
            slot.ready.record(self._copy_stream)
