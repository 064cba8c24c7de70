"""The host cost of a kernel whose bound launch encodes its weight's TMA descriptors once,
beside the same kernel with them encoded at every call (Triton's own launcher).

For each kernel named in :data:`ENCODED_ONCE`, :func:`per_call_twin` prepares the weight a
second time (other tensors, so other buckets and launches), binds it with
``quantcore.triton.launch.ENCODE_FIXED_DESCRIPTORS_ONCE`` off, and checks that both give
the same output bit for bit on the same activation. The notes say how many descriptors
each call encodes (counted around Triton's encoder), so a run shows whether the direct
launch was taken at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["ENCODED_ONCE", "encodings_per_call", "per_call_twin"]

#: The kernels whose bound launches take fixed descriptors.
ENCODED_ONCE = ("hopper_wgmma",)
#: The note of a twin whose output is not the direct launch's, bit for bit.
DIFFER = "outputs DIFFER"


@contextlib.contextmanager
def _counting(counts: list[int]) -> Iterator[None]:
    """Triton's descriptor encoder, counted (the direct launch and Triton's wrapper both
    look it up on the driver module at each call)."""
    from triton.backends.nvidia import driver

    real = driver.make_tensordesc_arg

    def make(arg: Any, meta: Any) -> Any:
        counts[0] += 1
        return real(arg, meta)

    driver.make_tensordesc_arg = make
    try:
        yield
    finally:
        driver.make_tensordesc_arg = real


def encodings_per_call(call: Callable[[], object]) -> int:
    """Descriptors a warm call encodes."""
    call()
    counts = [0]
    with _counting(counts):
        call()
    return counts[0]


def _bits(y: torch.Tensor) -> torch.Tensor:
    return y.view(torch.int16) if y.element_size() == 2 else y.view(torch.int32)


def per_call_twin(kernel: Any, tensors: dict[str, torch.Tensor], x: torch.Tensor,
                  prepared: Any) -> tuple[Callable[[int], object], str, str]:
    """``(fn, note of the twin, note of the kernel)``: ``kernel`` on a second preparation
    of ``tensors``, bound with the descriptors encoded per call."""
    from quantcore.triton import launch

    twin = kernel.prepare(tensors, dtype=x.dtype)
    launch.ENCODE_FIXED_DESCRIPTORS_ONCE = False
    try:
        kernel(x, twin)  # binds the twin's launch for this M
    finally:
        launch.ENCODE_FIXED_DESCRIPTORS_ONCE = True
    kernel(x, prepared)  # binds, through kernel[grid]; the next calls launch directly
    same = torch.equal(_bits(kernel(x, prepared)), _bits(kernel(x, twin)))
    once = encodings_per_call(lambda: kernel(x, prepared))
    each = encodings_per_call(lambda: kernel(x, twin))
    verdict = "outputs bit-identical to the direct launch" if same else f"{DIFFER} from the direct launch"
    return (lambda i: kernel(x, twin), f"descriptors encoded per call: {each}; {verdict}",
            f"descriptors encoded per call: {once}")
