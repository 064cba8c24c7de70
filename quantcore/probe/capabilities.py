"""What a device offers, as data. Produced by :func:`quantcore.probe`; read by kernels."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Capabilities", "PackageStatus"]


@dataclass(frozen=True)
class PackageStatus:
    """A Python package as seen from one device: installed? which version? usable there?"""

    name: str
    version: str | None = None
    usable: bool = False
    reason: str = ""

    def describe(self) -> str:
        """``3.6.0``, ``3.6.0 (through the interpreter …)``, ``3.6.0 installed, <why not
        usable as is>`` or ``no (not installed)``."""
        if self.usable:
            version = self.version or "yes"
            return f"{version} ({self.reason})" if self.reason else version
        if self.version:
            return f"{self.version} installed, {self.reason or 'not usable here'}"
        return f"no ({self.reason})" if self.reason else "no"


@dataclass(frozen=True)
class Capabilities:
    """One device, probed once and cached. An absent device is an answer, not an error:
    ``available`` is False and ``reason`` says why."""

    device: str
    device_type: str
    available: bool
    reason: str = ""
    name: str = ""
    compute_capability: tuple[int, int] | None = None
    torch_version: str = ""
    packages: tuple[PackageStatus, ...] = ()
    #: aten ops that have a kernel for this device's dispatch key, of those quantcore uses.
    aten_ops: frozenset[str] = frozenset()
    fp8: bool = False
    fp4: bool = False
    cpu_isa: str = ""
    memory_bytes: int | None = None
    extra: tuple[tuple[str, str], ...] = field(default=())

    def package(self, name: str) -> PackageStatus:
        for p in self.packages:
            if p.name == name:
                return p
        return PackageStatus(name, reason="not probed")

    def has_op(self, op: str) -> bool:
        return op in self.aten_ops

    def as_rows(self) -> list[tuple[str, str]]:
        """(field, value) pairs for ``quantcore doctor``."""
        cc = ".".join(map(str, self.compute_capability)) if self.compute_capability else "-"
        rows = [
            ("available", "yes" if self.available else f"no ({self.reason})"),
            ("name", self.name or "-"),
            ("compute capability", cc),
            ("torch", self.torch_version),
            ("cpu isa", self.cpu_isa or "-"),
            ("fp8 / fp4", f"{'yes' if self.fp8 else 'no'} / {'yes' if self.fp4 else 'no'}"),
            ("aten int4 ops", ", ".join(sorted(self.aten_ops)) or "-"),
        ]
        rows += [(f"package {p.name}", p.describe()) for p in self.packages]
        rows += list(self.extra)
        return rows
