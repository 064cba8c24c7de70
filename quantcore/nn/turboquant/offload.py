"""CPU offload of pass 2: pinned host memory, two GPU scratch slots, a copy stream.

When GPU memory is short, the residual pass's data (indices, scales, rotation — about
half of a layer's quantized bytes) stays in pinned host memory and is copied into one
of two GPU scratch slots shared by every offloaded layer, one layer ahead of use. Per
layer, a prefetch chain of four steps:

1. fence: record an event on the compute stream; the copy stream waits for it, so a
   slot is never overwritten while a kernel queued earlier may still read it;
2. async H2D of the *next* layer's pass-2 data into the other slot, on the copy stream:
   one copy, since a layer's pass-2 tensors are packed into one pinned buffer;
3. the compute stream waits for this layer's copy (issued by the previous layer, so it
   overlapped that layer's compute);
4. both passes, pass 1 resident and pass 2 from the slot, in one kernel call
   (``run_passes``: one launch where the kernel fuses passes).

Per layer that is two event records, one stream wait and one copy: the views that read
a slot and the events are made once and reused (made per call, they cost about 100 µs of
host time per layer on an H100 host).

The chain is the order in which offloaded layers first run (their execution order);
the last layer prefetches the first, so a decode loop stays pipelined across steps.
A layer whose data is not in a slot when it runs (the first forward, or calls out of
chain order) loads it itself: slower, never wrong. Data in a slot are the same bytes
as the resident copy, and kernels read them through the same ``run_passes``, so outputs
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


#: Byte alignment of each tensor inside a packed pass (the kernels load 16-byte vectors).
_ALIGN = 256


@dataclass(frozen=True)
class _Field:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _pack(host: PassData) -> tuple[torch.Tensor, tuple[_Field, ...]]:
    """Every tensor of ``host`` in one pinned byte buffer: one H2D copy per layer, not three."""
    fields, offset = [], 0
    for name, t in host.tensors().items():
        nbytes = t.numel() * t.element_size()
        fields.append(_Field(name, t.dtype, tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    flat = pin(torch.empty(offset, dtype=torch.uint8))
    for f, t in zip(fields, host.tensors().values(), strict=True):
        flat[f.offset:f.offset + f.nbytes].copy_(t.contiguous().view(-1).view(torch.uint8))
    return flat, tuple(fields)


def _views(buffer: torch.Tensor, fields: tuple[_Field, ...]) -> PassData:
    return PassData(**{f.name: buffer[f.offset:f.offset + f.nbytes].view(f.dtype).view(f.shape) for f in fields})


@dataclass(eq=False)
class OffloadedPass:
    """One layer's pass 2 in host memory, in its kernel's layout, packed into one pinned
    buffer (``flat``); ``host`` views it field by field."""

    host: PassData
    name: str = ""
    position: int = -1  # in the pool's chain
    flat: torch.Tensor = field(init=False, repr=False)
    fields: tuple[_Field, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.flat, self.fields = _pack(self.host)
        self.host = _views(self.flat, self.fields)


@dataclass(eq=False)
class _Slot:
    """A GPU scratch buffer, the entry whose bytes it holds, and — cached per entry, so a
    layer's step costs a few calls — the views that read it and the destination of the
    copy. The two events are recorded again at every load (a wait uses the latest record)."""

    buffer: torch.Tensor | None = None
    #: ``buffer``'s memory as another tensor, the copies' destination: it has its own
    #: version counter, so a reload leaves the views' unchanged. An entry's bytes are the
    #: same at every load, and what a kernel keeps from them (the rotations' GEMM operand
    #: copied once) stays right; a version bumped at each load would make it again at
    #: every call (hundreds of µs of host a layer, the copy no longer hidden).
    landing: torch.Tensor | None = None
    owner: OffloadedPass | None = None
    views: dict[OffloadedPass, tuple[PassData, torch.Tensor]] = field(default_factory=dict)
    fence: torch.cuda.Event | None = None  # compute stream reached the load: the slot is free
    ready: torch.cuda.Event | None = None  # the copy into this slot has finished
    copying: bool = False

    def view(self, entry: OffloadedPass) -> tuple[PassData, torch.Tensor]:
        hit = self.views.get(entry)
        if hit is None:
            assert self.buffer is not None
            assert self.landing is not None
            hit = self.views[entry] = (_views(self.buffer, entry.fields), self.landing[: entry.flat.numel()])
        return hit


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
        need = entry.flat.numel()
        if all(slot.buffer is not None and slot.buffer.numel() >= need for slot in self._slots):
            return
        self.synchronize()  # nothing may still be copying into the buffers we replace
        for slot in self._slots:
            if slot.buffer is None or slot.buffer.numel() < need:
                slot.buffer = torch.empty(need, dtype=torch.uint8, device=self.device)
                slot.landing = torch.empty(0, dtype=torch.uint8, device=self.device).set_(
                    slot.buffer.untyped_storage(), 0, (need,), (1,))
            slot.owner = None  # contents no longer trusted after a resize
            slot.views.clear()

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
        if slot.copying and slot.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(slot.ready)
        return slot.view(entry)[0]

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
        dst = slot.view(entry)[1]
        if self._copy_stream is None:
            dst.copy_(entry.flat)
            slot.copying = False
            return
        if slot.fence is None or slot.ready is None:
            slot.fence, slot.ready = torch.cuda.Event(), torch.cuda.Event()
        fence, ready = slot.fence, slot.ready
        fence.record(torch.cuda.current_stream(self.device))  # step 1
        with torch.cuda.stream(self._copy_stream):
            self._copy_stream.wait_event(fence)
            dst.copy_(entry.flat, non_blocking=True)  # step 2: one copy of the packed pass
            ready.record(self._copy_stream)
        slot.copying = True
