"""The Kernel interface: one op, one format, some devices.

Modelled on vLLM's mixed-precision kernels (a tiny class, a reason string for every
refusal, a one-time repack), with the device side split out: ``requires`` is checked
against probed :class:`~quantcore.probe.Capabilities`, ``supports`` against the
:class:`~quantcore.problem.Problem`, so ``explain`` can say which of the two refused.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch

from .cost import Cost
from .formats.base import Format
from .probe import Capabilities
from .probe.packages import release
from .problem import Problem

__all__ = ["Kernel", "LinearKernel", "Requirements", "Support"]


class Support(NamedTuple):
    """``(ok, reason)``; truthy when ok. ``reason`` says why not, or notes a caveat."""

    ok: bool
    reason: str = ""

    @classmethod
    def yes(cls, note: str = "") -> Support:
        return cls(True, note)

    @classmethod
    def no(cls, reason: str) -> Support:
        return cls(False, reason)

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class Requirements:
    """What a kernel needs from a device. Checked before ``supports``."""

    device_types: frozenset[str]
    min_capability: tuple[int, int] | None = None
    max_capability: tuple[int, int] | None = None
    packages: tuple[str, ...] = ()
    aten_ops: tuple[str, ...] = ()
    #: ``(package, oldest version)``: an installed version below it is refused here, with
    #: the reason, where it would otherwise fail at the kernel's first call (a compiler
    #: older than the language features the kernel is written in).
    min_versions: tuple[tuple[str, str], ...] = ()
    #: ``(package, first release refused)``: for a kernel written against an API that the
    #: package changes between releases (Triton's Gluon), the releases it is not known to
    #: compile with.
    below_versions: tuple[tuple[str, str], ...] = ()

    def check(self, caps: Capabilities) -> str | None:
        """None when met, else the reason (the first unmet requirement)."""
        if caps.device_type not in self.device_types:
            return f"runs on {'/'.join(sorted(self.device_types))}, not {caps.device_type}"
        if not caps.available:
            return f"{caps.device}: {caps.reason}"
        cc = caps.compute_capability
        # Compute capabilities are CUDA's: a kernel that also runs elsewhere (Triton's
        # interpreter on a CPU) states its CUDA floor here and is not held to it there.
        cuda = caps.device_type == "cuda"
        if cuda and self.min_capability and (cc is None or cc < self.min_capability):
            need = ".".join(map(str, self.min_capability))
            return f"needs compute capability >= {need}, device has {_cc(cc)}"
        if cuda and self.max_capability and cc is not None and cc > self.max_capability:
            top = ".".join(map(str, self.max_capability))
            return f"needs compute capability <= {top}, device has {_cc(cc)}"
        for pkg in self.packages:
            status = caps.package(pkg)
            if not status.usable:
                return f"package {pkg}: {status.reason or 'unusable'}"
        for pkg, oldest in self.min_versions:
            version = caps.package(pkg).version
            if version is not None and release(version) < release(oldest):
                return f"package {pkg}: {version} installed, needs {oldest} or newer"
        for pkg, refused in self.below_versions:
            version = caps.package(pkg).version
            if version is not None and release(version) >= release(refused):
                return f"package {pkg}: {version} installed, needs a release below {refused}"
        for op in self.aten_ops:
            if not caps.has_op(op):
                return f"aten.{op} has no {caps.device_type} kernel in torch {caps.torch_version}"
        return None


def _cc(cc: tuple[int, int] | None) -> str:
    return ".".join(map(str, cc)) if cc else "none"


class Kernel(ABC):
    """Runs ``op`` for one ``format`` on ``device``.

    Lifecycle: ``get_kernel`` builds ``Kernel(fmt, device)``; the caller runs
    ``prepare(tensors)`` once per weight (the transform into the kernel's layout), then
    calls the kernel many times with that prepared state.
    """

    #: Unique name, also the name users pass to ``prefer=`` and ``QUANTCORE_DISABLE``.
    name: ClassVar[str]
    #: Format name this kernel runs (``Format.name``).
    format: ClassVar[str]
    op: ClassVar[str] = "linear"
    #: Higher wins among kernels that declare no :meth:`cost`; the kernels that declare one
    #: are compared by it, together at the highest priority among them (see ``selection``).
    priority: ClassVar[int] = 0
    #: True when the prepared state holds the weight dense (or wider): as much memory as the
    #: unquantized weight or more. Such a kernel is chosen by default only when nothing that
    #: keeps the weight compressed can run, or when the caller allows it (``allow_dense``).
    keeps_dense_weight: ClassVar[bool] = False
    requires: ClassVar[Requirements]
    #: One line for ``quantcore list``.
    description: ClassVar[str] = ""

    def __init__(self, fmt: Format, device: str | torch.device) -> None:
        self.fmt = fmt
        self.device = torch.device(device)

    @classmethod
    def check_device(cls, caps: Capabilities) -> str | None:
        """None if this kernel can run on the probed device, else why not."""
        return cls.requires.check(caps)

    @classmethod
    def priority_on(cls, caps: Capabilities) -> int:
        """Rank on this device; override when it depends on the device (a Triton kernel
        runs on CPU only under the interpreter, and should rank below plain torch there)."""
        return cls.priority

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost | None:
        """The estimated cost of one call of ``problem`` on this device (:mod:`quantcore.cost`),
        or None to declare none (the kernel then ranks by priority). Selection calls it with
        every dim of the problem set, after ``check_device`` and ``supports`` accepted it;
        it must not touch a device. Measured times replace it wherever they exist."""
        return None

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        """Shape, dtype and format-parameter limits. Must not touch a device."""
        return Support.yes()

    @abstractmethod
    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> Any:
        """Validate stored tensors and transform them into this kernel's runtime layout."""

    def prepared_schema(self, dims: Mapping[str, int]) -> Any:
        """What ``prepare`` makes for a weight of ``dims`` (the op's weight dims: K and N of
        a linear), as a schema (:mod:`quantcore.schema`): a prepared state handed back (a
        state dict, a custom op's arguments) is checked against it before any op reads it.

        None, the default, means *derive it*: the weights the op's harness draws for these
        dims are prepared in every activation dtype (with and without the op's optional
        tensors) and a state must equal one of the results in structure, dtypes and
        shapes (:mod:`quantcore.custom_ops.schema`). That is exact but costs a
        quantization per shape, and refuses a state whose structure depends on the
        weight's values (an optional tensor prepare leaves out for some weights): a
        kernel with such a state declares its schema here."""
        return None

    def stored_tensors(self, prepared: Any) -> dict[str, torch.Tensor] | None:
        """The format's tensors that ``prepare`` made ``prepared`` from, for a layout that
        loses nothing (the inverse of the kernel's transform); None, the default, where
        the layout cannot give them back."""
        return None

    if TYPE_CHECKING:
        # Each op kind's base declares the call with its own inputs (LinearKernel:
        # ``(x, prepared)``); code that holds a kernel of any op kind calls it with the
        # op's inputs, then the prepared state.
        def __call__(self, *inputs: Any, **options: Any) -> Any: ...

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.fmt.slug} on {self.device}>"


class LinearKernel(Kernel):
    """``y = x Wᵀ + b`` with W in a quantized format; ``x`` is ``[..., K]``."""

    op: ClassVar[str] = "linear"

    @abstractmethod
    def __call__(self, x: torch.Tensor, prepared: Any) -> torch.Tensor: ...

    def gated(self, x: torch.Tensor, prepared: Any, activation: str) -> torch.Tensor | None:
        """``act(h[..., :I]) · h[..., I:]`` ``[..., I]`` of this layer's output ``h = self(x,
        prepared)`` ``[..., 2·I]`` (a fused gate/up layer: gate's outputs, then up's), the
        same bits as ``gated_activation(h, activation)``
        (``quantcore/kernels/gated_activation/op.py``), in one launch where the kernel can
        end its own with the activation; or None, the default, where the kernel leaves the
        activation to the caller."""
        return None
