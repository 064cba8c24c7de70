"""Plugins that take quantcore's names, whatever their entry points are called.

Each example installs one to three third-party plugins as entry points (beside the
built-in ones, named so they sort before, between or after them) that contribute, in any
mix: a kernel under a built-in kernel's name (for the built-in's format or another), a
format under a built-in format's name, a kernel of a name of their own, a kernel whose
``requires`` or ``description`` is malformed. Whatever the order, every built-in keeps
its names and is the one ``get_kernel`` and ``explain`` choose; each clash and each
malformed kernel is its plugin's error, listed by ``quantcore list``; the others load.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore import registry as registry_module
from quantcore.cli.main import main
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import Requirements
from quantcore.problem import Problem
from quantcore.registry import ENTRY_POINT_GROUP, Registry, hookimpl
from quantcore.registry import manager as manager_module
from quantcore.selection import explain, get_kernel

from ..core.fakes import dense_kernel
from .fuzz.profiles import examples
from .fuzz.tally import attempt

FMT = GPTQ(group_size=32, sym=False)
P = Problem.linear(FMT, M=2, K=128, N=64, dtype=torch.float32)
_REAL_ENTRY_POINTS = manager_module._entry_points
_BUILTIN = Registry().load()
BUILTIN_KERNELS = sorted({(e.cls.format, e.cls.op, e.cls.name): e for e in _BUILTIN.kernels()
                          if e.plugin in {p.name for p in _BUILTIN.plugins() if p.builtin}}.items())
BUILTIN_FORMATS = sorted(_BUILTIN.formats())
NAMES = ("aaa", "aten", "aten_cpu0", "m_vendor", "quantcore", "torch", "zzz_vendor")


@dataclass
class FakeDist:
    name: str
    version: str = "1.0"


@dataclass
class FakeEntryPoint:
    name: str
    plugin: Any
    dist: FakeDist

    def load(self) -> Any:
        return self.plugin


class Contributes:
    def __init__(self, kernels: list[Any], formats: list[Any]) -> None:
        self._kernels, self._formats = kernels, formats

    @hookimpl
    def quantcore_kernels(self) -> list[Any]:
        return self._kernels

    @hookimpl
    def quantcore_formats(self) -> list[Any]:
        return self._formats


def impostor_format(name: str) -> type:
    class Impostor(GPTQ):
        pass

    Impostor.name = name  # type: ignore[misc]
    return Impostor


def malformed_kernel(what: str, name: str) -> type:
    k = dense_kernel(name)
    if what == "requires None":
        k.requires = None  # type: ignore[assignment]
    elif what == "requires a string":
        k.requires = "cpu"  # type: ignore[assignment]
    elif what == "device_types a string":
        k.requires = Requirements(device_types="cpu")  # type: ignore[arg-type]
    elif what == "description a number":
        k.description = 5  # type: ignore[assignment]
    else:
        k.name = ""  # type: ignore[misc]
    return k


@dataclass
class Contribution:
    plugin: str
    kind: str  # "clash", "format clash", "own", "malformed"
    detail: str
    item: Any


def draw_plugin(data: st.DataObject, index: int) -> tuple[str, list[Contribution]]:
    name = data.draw(st.sampled_from(NAMES), label="plugin name") + f"_{index}"
    items = []
    for _ in range(data.draw(st.integers(1, 3), label="items")):
        kind = data.draw(st.sampled_from(("clash", "format clash", "own", "malformed")), label="kind")
        if kind == "clash":
            (fmt, _op, kname), _ = data.draw(st.sampled_from(BUILTIN_KERNELS), label="taken")
            on = data.draw(st.sampled_from((fmt, "gptq", "awq")), label="for format")
            k = dense_kernel(kname, priority=10_000, fmt=on)
            items.append(Contribution(name, kind, kname, k))
        elif kind == "format clash":
            taken = data.draw(st.sampled_from(BUILTIN_FORMATS), label="format")
            items.append(Contribution(name, kind, taken, impostor_format(taken)))
        elif kind == "own":
            own = f"{name}_k{len(items)}"
            items.append(Contribution(name, kind, own, dense_kernel(own, priority=1)))
        else:
            what = data.draw(st.sampled_from(("requires None", "requires a string", "device_types a string",
                                              "description a number", "empty name")), label="malformed")
            items.append(Contribution(name, kind, what, malformed_kernel(what, f"{name}_bad{len(items)}")))
    return name, items


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def listed(reg: Registry, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, Any]]:
    monkeypatch.setattr(registry_module, "_default", reg)
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["list"])
    assert code == 0, out.getvalue()
    text = out.getvalue()
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["list", "--json", "-"]) == 0
    return text, json.loads(out.getvalue())


@settings(max_examples=examples("fast"))
@given(data=st.data())
def test_plugins_never_take_builtin_names(data: st.DataObject, monkeypatch: pytest.MonkeyPatch) -> None:
    plugins = [draw_plugin(data, i) for i in range(data.draw(st.integers(1, 3), label="plugins"))]
    fakes = [FakeEntryPoint(name, Contributes([c.item for c in items if c.kind != "format clash"],
                                              [c.item for c in items if c.kind == "format clash"]),
                            FakeDist(f"vendor-{name}")) for name, items in plugins]

    def entry_points(group: str) -> list[Any]:
        real = list(_REAL_ENTRY_POINTS(group))
        return [*real, *fakes] if group == ENTRY_POINT_GROUP else real

    monkeypatch.setattr(manager_module, "_entry_points", entry_points)
    contributions = [c for _, items in plugins for c in items]

    def load() -> tuple[Registry, str, dict[str, Any]]:
        reg = Registry(blocked=()).load()
        text, listing = listed(reg, monkeypatch)
        return reg, text, listing

    def judge(result: tuple[Registry, str, dict[str, Any]]) -> str | None:
        reg, text, listing = result
        for (fmt, op, kname), entry in BUILTIN_KERNELS:
            held = reg.kernel(fmt, op, kname)
            if held.plugin != entry.plugin or _path(held.cls) != _path(entry.cls):
                return f"{fmt}/{op}/{kname} is {held.cls} from {held.plugin}, not the built-in"
        formats = reg.formats()
        for name in BUILTIN_FORMATS:
            if formats[name] is not _BUILTIN.formats()[name]:
                return f"format {name} is {formats[name]}, not the built-in"
        statuses = {p["name"]: p["status"] for p in listing["plugins"]}
        broken: dict[str, list[str]] = {b.plugin: [] for b in reg.broken()}
        for b in reg.broken():
            broken[b.plugin].append(b.error)
        for c in contributions:
            errors = " ".join(broken.get(c.plugin, []))
            if c.kind in ("clash", "format clash") and repr(c.detail) not in errors:
                return f"{c.plugin}'s {c.kind} on {c.detail!r} is not its error: {errors or 'no error'}"
            if c.kind == "malformed" and not errors:
                return f"{c.plugin}'s malformed kernel ({c.detail}) is not its error"
            if c.kind == "own" and c.plugin not in broken and c.detail not in {e.cls.name for e in reg.kernels()}:
                return f"{c.plugin}'s own kernel {c.detail} did not load"
            if (c.kind != "own" or c.plugin in broken) and (f"{c.plugin} [" not in text
                                                             or statuses.get(c.plugin) != "broken"):
                return f"quantcore list does not show {c.plugin}'s error"
        chosen = get_kernel(FMT, "cpu", problem=P, registry=reg)
        if type(chosen).__module__.startswith("tests."):
            return f"get_kernel chose {type(chosen).__name__} {chosen.name} of a plugin that took a built-in's name"
        if explain(FMT, "cpu", problem=P, registry=reg).selected is None:
            return "explain selects nothing"
        return None

    attempt("plugin:names", load, names=(), judge=judge, allow_refusal=False,
            context=lambda: "; ".join(f"{c.plugin}: {c.kind} {c.detail}" for c in contributions))

