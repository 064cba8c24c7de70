"""Triton's interpreter with every memory access checked: each masked-in address a load or
a store touches must lie inside one of the launch's tensor arguments (each as the
kernel sees it: from its first element to the end of its last). The interpreter itself
reads and writes host memory through raw pointers, so an out-of-bounds access there is
silent, or a crash of the whole process; with this check the launch fails with an
``AssertionError`` naming the access (the interpreter re-raises it as its
``InterpreterError``).

Only for ``TRITON_INTERPRET=1``; it patches the interpreter's builder and launcher for
the duration of the ``with`` block (through ``pytest.MonkeyPatch``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

__all__ = ["bounds_checked"]


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, past the last byte] of the elements of ``t`` (any strides)."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


@contextmanager
def bounds_checked(untouched: Sequence[torch.Tensor] = ()) -> Iterator[list[int]]:
    """Check every interpreted load and store in the block; yields a one-element list
    counting the accesses checked (so a test can tell the check ran). No access may touch
    the memory of the ``untouched`` tensors either."""
    from triton.runtime import interpreter

    extents: list[tuple[int, int]] = []
    forbidden = [_extent(t) for t in untouched]
    checked = [0]
    builder = interpreter.InterpreterBuilder
    init_args, load, store = (interpreter.GridExecutor._init_args_hst, builder.create_masked_load,
                              builder.create_masked_store)

    def init_args_checked(self: Any, args_dev: Any, kwargs: Any) -> Any:
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        extents[:] = [_extent(a) for a in [*args_hst, *kwargs_hst.values()] if isinstance(a, torch.Tensor)]
        return args_hst, kwargs_hst

    def check(ptrs: Any, mask: Any, what: str) -> None:
        size = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        addrs = np.broadcast_to(ptrs.data, np.shape(mask.data))[np.asarray(mask.data, dtype=bool)].astype(np.uint64)
        inside = np.zeros(addrs.shape, dtype=bool)
        for lo, hi in extents:
            inside |= (addrs >= lo) & (addrs + size <= hi)
        checked[0] += int(addrs.size)
        if not inside.all():
            bad = addrs[~inside][:4].tolist()
            raise AssertionError(f"{what} outside every tensor argument: {int((~inside).sum())} addresses, "
                                 f"first {bad}; arguments span {extents}")
        for lo, hi in forbidden:
            hit = (addrs + size > lo) & (addrs < hi)
            if hit.any():
                raise AssertionError(f"{what} of {int(hit.sum())} addresses in a tensor it must not touch "
                                     f"[{lo}, {hi}), first {addrs[hit][:4].tolist()}")

    def load_checked(self: Any, ptrs: Any, mask: Any, other: Any, *rest: Any) -> Any:
        check(ptrs, mask, "load")
        return load(self, ptrs, mask, other, *rest)

    def store_checked(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        check(ptrs, mask, "store")
        return store(self, ptrs, value, mask, *rest)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(interpreter.GridExecutor, "_init_args_hst", init_args_checked)
        mp.setattr(builder, "create_masked_load", load_checked)
        mp.setattr(builder, "create_masked_store", store_checked)
        yield checked
