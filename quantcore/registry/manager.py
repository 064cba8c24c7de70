"""The registry: a pluggy PluginManager plus isolation of misbehaving plugins.

pluggy calls every implementation of a hook in one loop and lets the first exception
escape. A registry that serves many vendors cannot let one broken plugin hide the
others, so contributions are collected implementation by implementation: a plugin
that fails to import, raises in a hook or returns something that is not a Format or
Kernel class is recorded as broken with its error, and the rest load.

Names are owned. quantcore's own plugins load first, and the kernel and format names
they register are theirs: another plugin that registers one of them (whatever the
format, whatever the order of the entry points) is recorded broken for it, and the
built-in keeps running. Between other plugins the first to load (by entry-point name)
keeps a name.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from ..errors import PluginError, UnknownFormatError
from ..formats.base import Format
from ..kernel import Kernel, Requirements
from ..ops.case import Case
from .hookspecs import PROJECT, QuantcoreSpecs

__all__ = ["CASES_ENTRY_POINT_GROUP", "ENTRY_POINT_GROUP", "BrokenPlugin", "KernelEntry", "PluginInfo", "Registry"]

ENTRY_POINT_GROUP = "quantcore"
#: Plugins that contribute conformance cases only. Loaded the first time cases are asked
#: for (the matrix runs), never by ``get_kernel``: choosing a kernel imports no test code.
CASES_ENTRY_POINT_GROUP = "quantcore.conformance"
#: Comma-separated plugin (entry-point) names never to load, like pytest's ``-p no:NAME``.
ENV_BLOCK = "QUANTCORE_BLOCK_PLUGINS"


@dataclass(frozen=True)
class BrokenPlugin:
    plugin: str
    stage: str  # "import", "register", a hook name, or "validate"
    error: str
    detail: str = ""


@dataclass(frozen=True)
class KernelEntry:
    cls: type[Kernel]
    plugin: str


@dataclass
class PluginInfo:
    name: str
    source: str  # "entry point <dist> <version>" or "runtime"
    formats: list[str] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)
    broken: list[BrokenPlugin] = field(default_factory=list)
    blocked: bool = False
    #: One of quantcore's own plugins (an entry point of the quantcore distribution).
    builtin: bool = False

    @property
    def status(self) -> str:
        if self.blocked:
            return "blocked"
        return "broken" if self.broken else "ok"


def _short_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Registry:
    """Formats, kernels and conformance cases from every plugin, loaded once."""

    def __init__(
        self,
        *,
        entry_point_group: str | None = ENTRY_POINT_GROUP,
        blocked: Iterable[str] | None = None,
    ) -> None:
        self._group = entry_point_group
        # A registry without entry points (tests) has no case plugins either.
        self._cases_group = CASES_ENTRY_POINT_GROUP if entry_point_group else None
        self._cases_loaded = False
        if blocked is None:
            blocked = (n.strip() for n in os.environ.get(ENV_BLOCK, "").split(","))
        self.blocked = frozenset(n for n in blocked if n)
        self._lock = threading.RLock()
        self._loaded = False
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(QuantcoreSpecs)
        self._plugins: dict[str, PluginInfo] = {}
        self._formats: dict[str, tuple[type[Format], str]] = {}
        # Keyed by (format, op, name): one backend name ("torch_fallback") may serve many formats.
        self._kernels: dict[tuple[str, str, str], KernelEntry] = {}
        self._cases: list[Any] | None = None
        #: Bumped on every change (what selection learnt about the previous one may be stale:
        #: see quantcore.selection.state).
        self.generation = 0

    # --- loading ----------------------------------------------------------------------------

    def load(self) -> Registry:
        """Load entry-point plugins once (idempotent, thread-safe)."""
        if self._loaded:
            return self
        with self._lock:
            if self._loaded:
                return self
            if self._group:
                self._load_group(self._group)
            self._changed()
            self._loaded = True  # last: a reader that sees it sees the final generation
        return self

    def _load_cases(self) -> None:
        """The case plugins' entry points, once (under the lock)."""
        if self._cases_loaded:
            return
        self._cases_loaded = True
        if self._cases_group:
            self._load_group(self._cases_group)

    def _load_group(self, group: str) -> None:
        # quantcore's own first: the names they register are theirs whatever the others are called.
        for ep in sorted(_entry_points(group), key=lambda e: (not _builtin(e), e.name)):
            dist = getattr(ep, "dist", None)
            source = f"entry point {dist.name} {dist.version}" if dist else "entry point"
            if ep.name in self.blocked:
                self._plugins[ep.name] = PluginInfo(ep.name, source, blocked=True)
                continue
            if ep.name in self._plugins:
                # Two distributions publish one plugin name: the first keeps it.
                clash = f"{ep.name} ({source})"
                info = PluginInfo(clash, source)
                info.broken.append(BrokenPlugin(
                    clash, "register",
                    f"plugin name {ep.name!r} is already registered by {self._plugins[ep.name].source}",
                ))
                self._plugins[clash] = info
                continue
            try:
                module = ep.load()
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                info = PluginInfo(ep.name, source)
                info.broken.append(
                    BrokenPlugin(ep.name, "import", _short_error(exc), traceback.format_exc())
                )
                self._plugins[ep.name] = info
                continue
            self._register(module, ep.name, source, builtin=_builtin(ep))

    def register(self, plugin: object, name: str | None = None) -> str:
        """Register a plugin object or module at run time (tests, notebooks)."""
        self.load()
        with self._lock:
            name = name or getattr(plugin, "__name__", None) or f"plugin-{id(plugin):x}"
            if name in self._plugins:
                raise PluginError(f"plugin name {name!r} is already registered")
            self._register(plugin, name, "runtime")
            self._changed()
            return name

    def unregister(self, name: str) -> None:
        with self._lock:
            info = self._plugins.pop(name, None)
            if info is None:
                raise PluginError(f"no plugin named {name!r}; registered: {sorted(self._plugins)}")
            if self.pm.get_plugin(name) is not None:
                self.pm.unregister(name=name)
            self._formats = {k: v for k, v in self._formats.items() if v[1] != name}
            self._kernels = {k: v for k, v in self._kernels.items() if v.plugin != name}
            self._cases = None
            self._changed()

    def _changed(self) -> None:
        self.generation += 1

    def _register(self, plugin: object, name: str, source: str, *, builtin: bool = False) -> None:
        info = PluginInfo(name, source, builtin=builtin)
        self._plugins[name] = info
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except Exception as exc:
            info.broken.append(BrokenPlugin(name, "register", _short_error(exc)))
            if self.pm.get_plugin(name) is not None:
                self.pm.unregister(name=name)
            return
        for fmt in self._call_one(name, "quantcore_formats", info):
            self._add_format(fmt, info)
        for kernel in self._call_one(name, "quantcore_kernels", info):
            self._add_kernel(kernel, info)
        self._cases = None

    def _call_one(self, plugin_name: str, hook: str, info: PluginInfo) -> list[Any]:
        caller = getattr(self.pm.hook, hook)
        out: list[Any] = []
        for impl in caller.get_hookimpls():
            if impl.plugin_name != plugin_name:
                continue
            try:
                result = impl.function()
                items = list(result) if result is not None else []
            except Exception as exc:
                info.broken.append(
                    BrokenPlugin(plugin_name, hook, _short_error(exc), traceback.format_exc())
                )
                continue
            out.extend(items)
        return out

    def _add_format(self, fmt: object, info: PluginInfo) -> None:
        if not (inspect.isclass(fmt) and issubclass(fmt, Format) and isinstance(getattr(fmt, "name", None), str)):
            info.broken.append(
                BrokenPlugin(info.name, "validate", f"quantcore_formats returned {fmt!r}, not a Format subclass with a name")
            )
            return
        if not fmt.name:
            info.broken.append(BrokenPlugin(info.name, "validate", f"quantcore_formats returned {fmt!r} with an empty name"))
            return
        owner = self._formats.get(fmt.name)
        if owner is not None and owner[0] is not fmt:
            info.broken.append(
                BrokenPlugin(info.name, "validate", f"format {fmt.name!r} is already registered by plugin {owner[1]!r}")
            )
            return
        self._formats[fmt.name] = (fmt, info.name)
        info.formats.append(fmt.name)

    def _add_kernel(self, kernel: object, info: PluginInfo) -> None:
        problem = _kernel_problem(kernel)
        if problem:
            info.broken.append(BrokenPlugin(info.name, "validate", f"quantcore_kernels returned {kernel!r}: {problem}"))
            return
        assert inspect.isclass(kernel) and issubclass(kernel, Kernel)
        key = (kernel.format, kernel.op, kernel.name)
        owner = self._kernels.get(key)
        if owner is not None and owner.cls is not kernel:
            info.broken.append(
                BrokenPlugin(
                    info.name, "validate",
                    f"kernel {kernel.name!r} for {kernel.format}/{kernel.op} is already registered "
                    f"by plugin {owner.plugin!r}",
                )
            )
            return
        builtin = self._builtin_kernel(kernel.name)
        if builtin is not None and not info.builtin and builtin.cls is not kernel:
            info.broken.append(BrokenPlugin(
                info.name, "validate",
                f"kernel name {kernel.name!r} belongs to quantcore's plugin {builtin.plugin!r} (for "
                f"{builtin.cls.format}/{builtin.cls.op}); {kernel.__module__}.{kernel.__qualname__} must take another name",
            ))
            return
        self._kernels[key] = KernelEntry(kernel, info.name)
        info.kernels.append(kernel.name)

    def _builtin_kernel(self, name: str) -> KernelEntry | None:
        """A kernel of quantcore's own plugins called ``name`` (for any format)."""
        for entry in self._kernels.values():
            owner = self._plugins.get(entry.plugin)
            if entry.cls.name == name and owner is not None and owner.builtin:
                return entry
        return None

    # --- queries ----------------------------------------------------------------------------

    # Readers copy under the lock: a register() in another thread grows these dicts, and
    # iterating a dict while it grows raises.

    def plugins(self) -> list[PluginInfo]:
        self.load()
        with self._lock:
            return list(self._plugins.values())

    def broken(self) -> list[BrokenPlugin]:
        return [b for p in self.plugins() for b in list(p.broken)]

    def formats(self) -> dict[str, type[Format]]:
        self.load()
        with self._lock:
            return {name: cls for name, (cls, _) in self._formats.items()}

    def format_class(self, name: str) -> type[Format]:
        formats = self.formats()
        try:
            return formats[name]
        except KeyError:
            raise UnknownFormatError(
                f"format: expected one of {sorted(formats)}, got {name!r}"
            ) from None

    def kernels(self, format_name: str | None = None, op: str | None = None) -> list[KernelEntry]:
        self.load()
        with self._lock:
            entries = list(self._kernels.values())
        return [
            e
            for e in entries
            if (format_name is None or e.cls.format == format_name) and (op is None or e.cls.op == op)
        ]

    def kernel(self, format_name: str, op: str, name: str) -> KernelEntry:
        self.load()
        try:
            return self._kernels[(format_name, op, name)]
        except KeyError:
            names = sorted(e.cls.name for e in self.kernels(format_name, op))
            raise PluginError(
                f"kernel: expected one of {names} for {format_name}/{op}, got {name!r}"
            ) from None

    def conformance_cases(self) -> list[Any]:
        """Every plugin's cases, gathered with the same isolation as formats and kernels;
        the first call also loads the case plugins (:data:`CASES_ENTRY_POINT_GROUP`)."""
        self.load()
        with self._lock:
            if not self._cases_loaded:
                self._load_cases()
                self._changed()
            if self._cases is None:
                cases: list[Any] = []
                for name, info in self._plugins.items():
                    if self.pm.get_plugin(name) is None:
                        continue
                    for case in self._call_one(name, "quantcore_conformance_cases", info):
                        if isinstance(case, Case):
                            cases.append(case)
                        else:
                            info.broken.append(BrokenPlugin(
                                name, "validate",
                                f"quantcore_conformance_cases returned {case!r:.80}, not a conformance Case",
                            ))
                self._cases = cases
            return list(self._cases)


def _kernel_problem(kernel: object) -> str:
    if not (inspect.isclass(kernel) and issubclass(kernel, Kernel)):
        return "not a Kernel subclass"
    if inspect.isabstract(kernel):
        missing = ", ".join(sorted(getattr(kernel, "__abstractmethods__", ())))
        return f"abstract (does not implement {missing})"
    for attr, kind in (("name", str), ("format", str), ("op", str), ("priority", int), ("description", str)):
        value = getattr(kernel, attr, None)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"class attribute {attr!r} must be a {kind.__name__}, got {value!r:.60}"
    if not kernel.name or not kernel.format:
        return "class attributes 'name' and 'format' must not be empty"
    requires = getattr(kernel, "requires", None)
    if not isinstance(requires, Requirements):
        return f"'requires' must be a quantcore.Requirements, got {requires!r:.60}"
    if not isinstance(requires.device_types, (set, frozenset)) or not requires.device_types \
            or not all(isinstance(d, str) for d in requires.device_types):
        return f"'requires.device_types' must be a non-empty set of device type names, got {requires.device_types!r:.60}"
    for attr in ("packages", "aten_ops"):
        value = getattr(requires, attr)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            return f"'requires.{attr}' must be a tuple of names, got {value!r:.60}"
    for attr in ("min_capability", "max_capability"):
        cc = getattr(requires, attr)
        if cc is not None and not (isinstance(cc, tuple) and len(cc) == 2 and all(type(v) is int for v in cc)):
            return f"'requires.{attr}' must be None or a (major, minor) pair, got {cc!r:.60}"
    return ""


def _builtin(ep: importlib.metadata.EntryPoint) -> bool:
    dist = getattr(ep, "dist", None)
    return dist is not None and dist.name == "quantcore"


def _entry_points(group: str) -> Iterable[importlib.metadata.EntryPoint]:
    return importlib.metadata.entry_points(group=group)


