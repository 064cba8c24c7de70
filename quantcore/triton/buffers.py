"""Buffers a launcher keeps between calls (split-K tickets and counters, dequantization
scratch), safe under CUDA graphs.

A cache filled while ``torch.compile(mode="reduce-overhead")`` warms up or records a graph
would otherwise take its memory from the graph's private pool and outlive the call, which
cudagraph trees refuse ("tensor(s) in the cudagraph pool not tracked as outputs"). The
trees route into their pool what the *thread* that runs the model allocates
(``_cuda_beginAllocateCurrentThreadToPool``), so a kept buffer is allocated by a short-lived
helper thread, from the caching allocator's default pool. While a stream is being
captured, a buffer the cache lacks is made for that graph alone (:func:`capturing`: the
caller must not keep it), once per capture and key (:func:`capture_id`): a graph recorded
on a stream that never ran the kernel eagerly (``torch.cuda.graph``'s own capture stream,
as engines use it) would otherwise get a zero-fill node before every launch, which costs
its time and breaks a programmatic-dependent-launch chain between two launches.

Kept buffers only grow (:func:`grown`, :class:`KeptBuffers`): an outgrown one is retired,
not freed, because a CUDA graph captured earlier may still read or write it.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Hashable, MutableMapping
from typing import Any

import torch

from .cuda_driver import libcuda

__all__ = ["KeptBuffers", "capture_id", "capturing", "current_stream", "grown", "kept_buffer", "retired", "stream_key"]

_CAPTURE_ACTIVE = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE


def capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is recording a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@functools.cache
def _capture_info() -> Callable[..., int] | None:
    """The driver's ``cuStreamGetCaptureInfo_v2`` (every driver since CUDA 11.3 exports it),
    or None where there is no CUDA driver to ask."""
    try:
        fn = libcuda().cuStreamGetCaptureInfo_v2
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn  # type: ignore[no-any-return]


def capture_id(device: torch.device) -> int | None:
    """The driver's id of the capture the current stream of ``device`` is recording (unique
    in the process), or None: not capturing, or no driver to ask."""
    if not capturing(device):
        return None
    info = _capture_info()
    if info is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    status, ident = ctypes.c_int(0), ctypes.c_uint64(0)
    stream = torch._C._cuda_getCurrentRawStream(index)  # type: ignore[attr-defined]
    if info(stream, ctypes.byref(status), ctypes.byref(ident), None, None, None) != 0 or status.value != _CAPTURE_ACTIVE:
        return None
    return int(ident.value)


def kept_buffer(numel: int, dtype: torch.dtype, device: torch.device, *, zero: bool) -> torch.Tensor:
    """A buffer for a cache to keep: on a CUDA device, from the caching allocator's default
    pool even while cudagraph trees route this thread into theirs; zeroed when ``zero``."""
    make = torch.zeros if zero else torch.empty
    if device.type != "cuda" or capturing(device):
        # Kept past the call: never an inference tensor, which later in-place use outside
        # inference mode would refuse. (A CUDA buffer is made on a helper thread, where the
        # caller's inference mode does not apply.)
        with torch.inference_mode(False):
            return make(numel, dtype=dtype, device=device)
    made: list[torch.Tensor] = []

    def allocate() -> None:
        with torch.cuda.device(device):
            made.append(make(numel, dtype=dtype, device=device))
            torch.cuda.synchronize(device)  # zeroed before any stream of the caller reads it

    helper = threading.Thread(target=allocate, name="quantcore-kept-buffer")
    helper.start()
    helper.join()
    if not made:
        raise RuntimeError(f"quantcore.triton.buffers: allocating {numel} {dtype} on {device} failed "
                           "(see the thread's error)")
    return made[0]


_lock = threading.Lock()
#: Outgrown buffers stay allocated: a CUDA graph captured earlier may still use them.
_retired: list[torch.Tensor] = []


def grown(
    store: MutableMapping[Hashable, torch.Tensor], key: Hashable, numel: int, dtype: torch.dtype,
    device: torch.device, *, zero: bool, minimum: int = 0, doubling: bool = False,
) -> torch.Tensor:
    """``store[key]`` when it holds at least ``numel`` elements; else a larger kept buffer
    (at least ``minimum``, and twice the old one with ``doubling``) replaces it there and the
    old one is retired. While ``device`` captures a graph, a missing or short buffer is
    made for that graph alone and not stored. The result may be longer than ``numel``."""
    with _lock:
        have = store.get(key)
        if have is not None and have.numel() >= numel:
            return have
        if capturing(device):  # this graph's own, not kept
            return _for_this_capture(store, key, numel, dtype, device, zero)
        size = max(numel, minimum, 2 * have.numel() if doubling and have is not None else 0)
        if have is not None:
            _retired.append(have)
        store[key] = made = kept_buffer(size, dtype, device, zero=zero)
        return made


#: By (store, key): the buffer the capture of id ``_captured_in[0]`` was handed. Only the
#: latest capture's are held: a new capture releases the ones before it into their graphs'
#: pools (where a graph's replays keep using them, as its other intermediates).
_captured: dict[tuple[int, Hashable], torch.Tensor] = {}
_captured_in = [-1]


def _for_this_capture(store: MutableMapping[Hashable, torch.Tensor], key: Hashable, numel: int, dtype: torch.dtype,
                      device: torch.device, zero: bool) -> torch.Tensor:
    """A buffer for the graph being captured: the one this capture was already handed for
    ``store[key]`` when it still fits, so that the graph zeroes it once, not per launch
    (every launch leaves its tickets at zero again, in stream order); made anew where the
    capture cannot be identified."""
    make: Any = torch.zeros if zero else torch.empty
    ident = capture_id(device)
    if ident is None:
        return make(numel, dtype=dtype, device=device)  # type: ignore[no-any-return]
    if _captured_in[0] != ident:
        _captured.clear()
        _captured_in[0] = ident
    slot = (id(store), key)
    hit = _captured.get(slot)
    if hit is not None and hit.numel() >= numel and hit.dtype == dtype:
        return hit
    made: torch.Tensor = make(numel, dtype=dtype, device=device)
    _captured[slot] = made
    return made


def retired() -> int:
    """How many outgrown buffers are kept alive (for tests)."""
    return len(_retired)


def stream_key(device: torch.device) -> tuple[str | int, int]:
    """``(device, current stream)``: launches that may run concurrently on two streams must
    not share tickets or scratch. A CUDA device is its index (``cuda`` and ``cuda:0`` alike;
    its name would be a string built per call), the stream the raw query's handle (a
    ``torch.cuda.Stream`` object per call costs microseconds)."""
    if device.type != "cuda":
        return str(device), 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return index, torch._C._cuda_getCurrentRawStream(index)  # type: ignore[attr-defined]


def current_stream(device: torch.device) -> Callable[[], int]:
    """``device``'s current stream as :func:`stream_key` reads it (the raw handle; 0 off
    CUDA), as a query bound to the device once: for a caller that asks at every call (a
    CUDA device with its index, as a tensor's is: the index is read here, not per call)."""
    if device.type != "cuda":
        return lambda: 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return functools.partial(torch._C._cuda_getCurrentRawStream, index)  # type: ignore[attr-defined]


class KeptBuffers:
    """A launcher's kept buffers of one kind, by key (:func:`grown` with fixed rules).

    ``dtype`` None means the caller names it per call (a scratch per activation dtype)."""

    def __init__(self, dtype: torch.dtype | None, *, zero: bool, minimum: int = 0, doubling: bool = False) -> None:
        self.dtype, self.zero, self.minimum, self.doubling = dtype, zero, minimum, doubling
        self._kept: dict[Hashable, torch.Tensor] = {}

    def get(self, key: Hashable, numel: int, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = dtype or self.dtype
        if dtype is None:
            raise TypeError("KeptBuffers.get: this kind has no dtype of its own; pass dtype=")
        # A launch's common case, without the lock: a kept buffer is only ever replaced whole.
        have = self._kept.get(key)
        if have is not None and have.numel() >= numel and have.dtype == dtype:
            return have
        return grown(self._kept, key, numel, dtype, device, zero=self.zero, minimum=self.minimum,
                     doubling=self.doubling)
