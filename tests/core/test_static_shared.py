"""quantcore.triton.static_shared: the opt-in that lets a kernel with a static shared table
of its own (inline PTX) launch beside Triton's dynamic shared memory above 48 KB.
A stand-in driver records what it is asked; no GPU here."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pytest

from quantcore.triton.static_shared import DEFAULT_LIMIT, opt_in


class Driver:
    """cuFuncGetAttribute / cuFuncSetAttribute over one function's static size."""

    def __init__(self, static: int, refuse: int = 0) -> None:
        self.static, self.refuse = static, refuse
        self.set: list[tuple[int, int]] = []

    def cuFuncGetAttribute(self, out: Any, attribute: int, function: ctypes.c_void_p) -> int:
        assert attribute == 1 and function.value == 99
        out._obj.value = self.static
        return 0

    def cuFuncSetAttribute(self, function: ctypes.c_void_p, attribute: int, value: ctypes.c_int) -> int:
        self.set.append((attribute, value.value))
        return self.refuse

    def cuFuncSetCacheConfig(self, function: ctypes.c_void_p, config: int) -> int:
        self.set.append((-1, config))
        return 0


def _kernel(dynamic: int) -> Any:
    loaded: list[bool] = []
    return SimpleNamespace(name="k", function=99, metadata=SimpleNamespace(shared=dynamic),
                           _init_handles=lambda: loaded.append(True), loaded=loaded)


@pytest.mark.parametrize(
    ("static", "dynamic", "expected"),
    [
        (32 * 1024, 36 * 1024, [(8, 36 * 1024), (-1, 1)]),  # above 48 KB together: raised, carve-out for shared
        (1024, 36 * 1024, []),  # within 48 KB: left as loaded
        (32 * 1024, 64 * 1024, []),  # Triton raised it itself (its own part above 48 KB)
        (0, DEFAULT_LIMIT, []),
    ],
)
def test_the_limit_is_raised_only_where_static_and_dynamic_exceed_48_kb(static: int, dynamic: int,
                                                                         expected: list[tuple[int, int]]) -> None:
    driver, kernel = Driver(static), _kernel(dynamic)
    assert opt_in(kernel, driver) == static
    assert driver.set == expected
    assert kernel.loaded == [True]  # the binary is loaded before its handle is read


def test_a_refused_opt_in_names_the_kernel_and_both_sizes() -> None:
    with pytest.raises(RuntimeError, match=r"k: 32768 bytes of static and 40960 of dynamic.*CUDA error 1"):
        opt_in(_kernel(40 * 1024), Driver(32 * 1024, refuse=1))
