"""A stand-in for :class:`quantcore.triton.launch.Launch` that records what a launcher
binds and launches (no GPU), and Triton's specialisation of a recorded argument: what
the bound-launch tests of every Triton backend check a bucket with."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

__all__ = ["Recorder", "assert_fixed_arguments_specialise_alike", "record_launches", "specialisation"]


class Recorder:
    """Stands in for quantcore.triton.launch.Launch: records each bound launch's kernel,
    constexprs, options, varying positions, fixed descriptor and pointer positions and
    device, and each call's grid and arguments."""

    made: ClassVar[list[Recorder]] = []

    def __init__(self, fn: Any, *, constexprs: Any, options: Any = None, varying: Any = (),
                 fixed_descriptors: Any = (), fixed_pointers: Any = (), own_pointers: Any = (), device: Any) -> None:
        self.fn, self.constexprs, self.options = fn, dict(constexprs), dict(options or {})
        self.varying, self.fixed_descriptors, self.device = tuple(varying), tuple(fixed_descriptors), device
        self.fixed_pointers, self.own_pointers = tuple(fixed_pointers), tuple(own_pointers)
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        #: The stream each call was handed (``Launch.on``), None where it was not.
        self.streams: list[Any] = []
        Recorder.made.append(self)

    def __call__(self, grid: Any, *args: Any) -> None:
        self.calls.append((grid, args))
        self.streams.append(None)

    def on(self, stream: Any, grid: Any, *args: Any) -> None:
        self.calls.append((grid, args))
        self.streams.append(stream)


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


def assert_fixed_arguments_specialise_alike(launches: list[Recorder]) -> None:
    """Each launch was called, every argument at a position it does not declare
    ``varying`` specialised alike on all of its calls (else the binary compiled for one
    call would run another), and every fixed descriptor or pointer position held the same
    object (else the launch would take Triton's per-call path), a fixed pointer a tensor
    or None, and every own pointer a tensor on the launch's device."""
    for launch in launches:
        assert launch.calls, f"{launch.fn} was bound but never launched"
        for pos in range(len(launch.calls[0][1])):
            if pos not in launch.varying:
                specs = {repr(specialisation(launch.fn, pos, args[pos])) for _, args in launch.calls}
                assert len(specs) == 1, (launch.fn, pos, specs)
        for pos in launch.fixed_descriptors:
            assert len({id(args[pos]) for _, args in launch.calls}) == 1, (launch.fn, pos, "another descriptor")
        for pos in launch.fixed_pointers:
            assert pos not in launch.varying and pos not in launch.fixed_descriptors, (launch.fn, pos)
            held = [args[pos] for _, args in launch.calls]
            assert all(a is held[0] for a in held), (launch.fn, pos, "another tensor")
            assert held[0] is None or isinstance(held[0], torch.Tensor), (launch.fn, pos, type(held[0]))
        for pos in launch.own_pointers:
            assert pos not in launch.varying and pos not in launch.fixed_descriptors, (launch.fn, pos)
            assert pos not in launch.fixed_pointers, (launch.fn, pos)
            for _, args in launch.calls:
                assert isinstance(args[pos], torch.Tensor) and args[pos].device == launch.device, (launch.fn, pos)
