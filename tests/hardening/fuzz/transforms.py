"""Every :class:`~quantcore.transform.Transform` the installed plugins define, found by
subclass discovery, with what it takes to build, feed and judge each.

A *format transform* is built from one format instance (``__init__(self, fmt: SomeFormat,
*, flag: bool = ...)``) and applied to that format's stored tensors; the seeds of that
format feed it. Its result is judged by what it declares:

* a ``target`` format (AWQ → GPTQ): the target's golden dequantization of the result
  equals the source's, bit for bit;
* an inverse: every tensor the inverse gives back equals the source's;
* an opaque runtime layout (``-> Int4PackCPU``): a kernel whose ``prepare`` returns that
  type runs it, and its output must match the golden output of the source weights.

Transforms of another shape (the TensorRT-LLM preprocessor takes one int8 tensor) have
an explicit adapter in the test module. ``uncovered()`` lists any transform neither
way reaches, and a test fails on it: a new transform must be fuzzed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import pkgutil
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from quantcore.formats.base import Format
from quantcore.kernel import Kernel
from quantcore.transform import Transform

from .seeds import registry

__all__ = ["FormatTransform", "all_transforms", "format_transforms", "kernel_for_layout"]


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@functools.cache
def all_transforms() -> tuple[type[Transform[Any, Any]], ...]:
    """Every concrete Transform subclass, once every plugin's modules are imported."""
    reg = registry()
    # Transforms live in quantcore.transforms and beside the kernels that use them:
    # import every module of those packages, so discovery does not depend on what
    # happened to be imported first.
    packages = {"quantcore.transforms"} | {e.cls.__module__.rpartition(".")[0] for e in reg.kernels()}
    for package in sorted(p for p in packages if p):
        with contextlib.suppress(Exception):
            mod = importlib.import_module(package)
            for info in pkgutil.walk_packages(getattr(mod, "__path__", []), prefix=f"{package}."):
                with contextlib.suppress(Exception):  # a backend whose heavy dependency is absent
                    importlib.import_module(info.name)
    found = {t for t in _subclasses(Transform) if not inspect.isabstract(t)}
    return tuple(sorted(found, key=lambda t: (t.__module__, t.__qualname__)))


@dataclass(frozen=True)
class FormatTransform:
    cls: type[Transform[Any, Any]]
    format_cls: type[Format]
    #: keyword-only bool flags the constructor requires, tried both ways
    flags: tuple[str, ...]

    @property
    def name(self) -> str:
        return str(getattr(self.cls, "name", self.cls.__name__))

    def build(self, fmt: Format, **flags: bool) -> Transform[Any, Any]:
        return self.cls(fmt, **flags)  # type: ignore[call-arg]

    @property
    def output_type(self) -> Any:
        return _hints(self.cls.apply).get("return")


def _hints(fn: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return {}


def as_format_transform(cls: type[Transform[Any, Any]]) -> FormatTransform | None:
    sig = inspect.signature(cls.__init__)
    params = list(sig.parameters.values())[1:]
    hints = _hints(cls.__init__)
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return None
    fmt_type = hints.get(params[0].name)
    if not (inspect.isclass(fmt_type) and issubclass(fmt_type, Format)):
        return None
    flags = []
    for p in params[1:]:
        if p.default is not p.empty:
            continue
        if hints.get(p.name) is bool and p.kind is p.KEYWORD_ONLY:
            flags.append(p.name)
        else:
            return None
    return FormatTransform(cls, fmt_type, tuple(flags))


def format_transforms() -> list[FormatTransform]:
    return [ft for t in all_transforms() if (ft := as_format_transform(t)) is not None]


def kernel_for_layout(layout: Any, format_name: str) -> type[Kernel] | None:
    """A registered kernel whose ``prepare`` returns ``layout`` (the format's own first)."""
    matches = [e.cls for e in registry().kernels() if _hints(e.cls.prepare).get("return") is layout]
    matches.sort(key=lambda k: (k.format != format_name, k.name))
    return matches[0] if matches else None
