"""A stand-in for :class:`quantcore.triton.launch.Launch` that records what a launcher
binds and launches (no GPU), and Triton's specialisation of a recorded argument: what
the bound-launch tests of every Triton backend check a bucket with."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

__all__ = ["Recorder", "record_launches", "specialisation"]


class Recorder:
    """Stands in for quantcore.triton.launch.Launch: records each bound launch's kernel,
    constexprs, options, varying positions and device, and each call's grid and arguments."""

    made: ClassVar[list[Recorder]] = []

    def __init__(self, fn: Any, *, constexprs: Any, options: Any = None, varying: Any = (), device: Any) -> None:
        self.fn, self.constexprs, self.options = fn, dict(constexprs), dict(options or {})
        self.varying, self.device = tuple(varying), device
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        Recorder.made.append(self)

    def __call__(self, grid: Any, *args: Any) -> None:
        self.calls.append((grid, args))


def record_launches(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[Recorder]:
    """Every ``Launch`` that ``module`` makes during the test is a :class:`Recorder`;
    returns the list they are appended to, in order."""
    monkeypatch.setattr(Recorder, "made", [])
    monkeypatch.setattr(module, "Launch", Recorder)
    return Recorder.made


def specialisation(fn: Any, pos: int, v: Any) -> Any:
    """Triton's specialisation of argument ``pos`` of kernel ``fn`` (its
    ``do_not_specialize`` honoured); None for None."""
    if v is None:
        return None
    kept = set((getattr(fn, "kwargs", None) or {}).get("do_not_specialize") or ())
    kept |= {p.name for p in getattr(fn, "params", ()) if p.do_not_specialize}
    return native_specialize_impl(BaseBackend, v, False, fn.arg_names[pos] not in kept, True)
