"""The base of quantcore's torch modules: a kernel's prepared state, held as buffers.

A :class:`QuantModule` is bound once — :func:`quantcore.bind` picks the kernel for the
module's device and activation dtype and prepares the weight — and from then on holds
exactly that prepared state, flattened (:mod:`quantcore.custom_ops.state`) into
registered buffers. So:

* ``state_dict()`` is the prepared state plus, as ``_extra_state``, the op spec naming the
  kernel and how its tensors fit together; ``load_state_dict`` rebuilds any module of
  the same shape from it, including a skeleton built on ``meta`` and loaded with
  ``assign=True``, whatever kernel it had before;
* ``.to()`` / ``.cuda()`` move the buffers and never cast them (a dtype change would
  corrupt a kernel's layout: integer codes stay, float scales keep their precision);
  where the kernel cannot run on the new device the module says so at its next call,
  or, with ``keep_source=True``, prepares again there;
* the checkpoint's tensors are dropped once prepared (memory is the prepared bytes),
  unless ``keep_source=True`` keeps them for ``bind``'s run-time fallback: a kernel that
  fails in a call is recorded and the next candidate prepared from them.

Calls go through the op kind's custom op (``quantcore::linear`` …) whenever they are
traced — ``torch.compile`` (one op, no graph break), ``torch.export`` (the buffers are
the graph's buffers), fake or meta tensors — and straight to the kernel otherwise, which
runs the same code without the dispatcher's per-call cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from ..binding import BoundKernel, bind
from ..custom_ops import call_op, flatten, make_spec, resolve, traced
from ..errors import KernelInputError, TensorFormatError
from ..formats.base import Format
from ..kernel import Kernel
from ..problem import Problem

__all__ = ["QuantModule"]

EXTRA_STATE_VERSION = 1
#: Buffer-name prefix of the kept source tensors (never in the state dict).
SOURCE = "source_"


class QuantModule(nn.Module):
    """A module whose weight is one kernel's prepared state; subclasses give the op kind,
    the problem and ``forward``."""

    #: The op kind whose custom op runs the kernel (``"linear"``, ``"moe"``, …).
    op_kind: ClassVar[str]

    def __init__(
        self,
        fmt: Format,
        dims: Mapping[str, int],
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = torch.bfloat16,
        keep_source: bool = False,
    ) -> None:
        super().__init__()
        self.format = fmt
        #: The problem dims of the weight (K, N for a linear; E, K, N for a MoE GEMM, …).
        self.dims = dict(dims)
        #: The activation dtype the kernel was chosen and prepared for.
        self.dtype = dtype
        self.keep_source = keep_source
        self.kernel: Kernel | None = None
        #: (kernel, reason) for every candidate ``bind`` passed over for this weight.
        self.passed_over: list[tuple[str, str]] = []
        self._spec = ""
        self._names: tuple[str, ...] = ()
        self._prepared: Any = None
        self._bound: BoundKernel | None = None
        self._prefer: tuple[str, ...] = ()
        self._device = _concrete(device if device is not None else "cpu")
        #: Why the kernel cannot run where the module now is (set by a move), else None.
        self._unusable: str | None = None

    # --- binding ---------------------------------------------------------------------------

    def problem(self) -> Problem:
        """The problem ``bind`` chooses the kernel for (override for ops other than linear)."""
        return Problem.of(self.format, self.dims, self.dtype or torch.float32, op=self.op_kind)

    def bind_tensors(
        self, tensors: Mapping[str, torch.Tensor], *, prefer: str | Sequence[str] | None = None
    ) -> None:
        """Choose and prepare the kernel for ``tensors`` (a checkpoint's, validated by the
        format) on this module's device, and hold its prepared state."""
        dims = self.format.validate(tensors)
        mismatch = {k: (v, dims.get(k)) for k, v in self.dims.items() if dims.get(k) != v}
        if mismatch:
            said = ", ".join(f"{k}={got} (module: {want})" for k, (want, got) in mismatch.items())
            raise TensorFormatError(f"{self.format.slug} tensors: they describe {said}")
        if self._device.type == "meta":
            raise KernelInputError("device: a module on meta cannot prepare weights; build it on a real device")
        source = {k: v.detach().to(self._device) for k, v in tensors.items()}
        self._prefer = (prefer,) if isinstance(prefer, str) else tuple(prefer or ())
        bound = bind(self.format, self._device, source, problem=self.problem(), dtype=self.dtype,
                     prefer=self._prefer)
        for name in [n for n in self._buffers if n.startswith(SOURCE)]:
            del self._buffers[name]
        if self.keep_source:
            for name, t in source.items():
                self.register_buffer(SOURCE + name, t, persistent=False)
        self._bound = bound if self.keep_source else None
        self.passed_over = list(bound.passed_over)
        self._adopt(bound.kernel, bound.prepared)

    def _adopt(self, kernel: Kernel, prepared: Any) -> None:
        state = flatten(prepared, where=f"{kernel.name}.prepare()")
        for name in self._names:
            self._buffers.pop(name, None)
        names = tuple(self._free_name(n) for n in state.names)
        for name, t in zip(names, state.tensors, strict=True):
            self.register_buffer(name, t)
        self._names = names
        self._spec = make_spec(kernel, state, self.dims)
        self.kernel, self._prepared, self._unusable = kernel, prepared, None

    def _free_name(self, name: str) -> str:
        taken = hasattr(type(self), name) or name in self.__dict__ or name in self._modules or name.startswith(SOURCE)
        return f"state_{name}" if taken else name

    @property
    def prepared(self) -> Any:
        """The kernel's prepared state, built on the buffers as they are now."""
        if self._prepared is None and self._spec:
            self._prepared = resolve(self._spec).prepared(self.state_tensors())
        return self._prepared

    def state_tensors(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self._names]

    @property
    def has_weight(self) -> bool:
        return bool(self._spec)

    # --- calling ---------------------------------------------------------------------------

    def run_kernel(self, *inputs: Any, **options: Any) -> Any:
        """The op on the held state: through the custom op when traced, else the kernel."""
        if not self._spec:
            raise KernelInputError(
                f"{type(self).__name__}: no weight yet; load a state dict or bind the checkpoint's tensors"
            )
        if traced(inputs[0]):
            return call_op(self.op_kind, self._spec, self.state_tensors(), *inputs, **options)
        if self._unusable is not None:
            raise KernelInputError(self._unusable)
        if self._bound is not None:
            out = self._bound(*inputs, **options)
            if self._bound.kernel is not self.kernel:  # bind fell back to the next kernel
                self.passed_over = list(self._bound.passed_over)
                self._adopt(self._bound.kernel, self._bound.prepared)
            return out
        assert self.kernel is not None
        return self.kernel(*inputs, self.prepared, **options)  # type: ignore[operator]

    # --- state dict ------------------------------------------------------------------------

    def get_extra_state(self) -> dict[str, Any]:
        return {"version": EXTRA_STATE_VERSION, "spec": self._spec, "names": list(self._names)}

    def set_extra_state(self, state: Any) -> None:
        pass  # read in _load_from_state_dict, before the buffers it describes are loaded

    def _load_from_state_dict(
        self, state_dict: Mapping[str, Any], prefix: str, local_metadata: Any, strict: bool,
        missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str],
    ) -> None:
        extra = state_dict.get(prefix + "_extra_state")
        if isinstance(extra, dict) and extra.get("spec") and (
            extra["spec"] != self._spec or tuple(extra["names"]) != self._names
        ):
            self._restructure(extra, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        self._loaded()

    def _restructure(self, extra: Mapping[str, Any], state_dict: Mapping[str, Any], prefix: str) -> None:
        """Take the buffer layout (and kernel) the incoming state dict describes."""
        if extra.get("version") != EXTRA_STATE_VERSION:
            raise TensorFormatError(f"{prefix}_extra_state: version {extra.get('version')}, expected {EXTRA_STATE_VERSION}")
        r = resolve(extra["spec"])
        where = prefix.rstrip(".") or type(self).__name__
        if r.fmt != self.format or any(r.dims.get(k) != v for k, v in self.dims.items()):
            raise TensorFormatError(
                f"{where}: the state dict holds a {r.fmt.slug} weight of {r.dims}, the module is "
                f"{self.format.slug} of {self.dims}"
            )
        for name in self._names:
            self._buffers.pop(name, None)
        self._names = tuple(extra["names"])
        for name in self._names:
            incoming = state_dict.get(prefix + name)
            if isinstance(incoming, torch.Tensor):
                self.register_buffer(name, torch.empty_like(incoming, device=self._device))
        self._spec = extra["spec"]
        self.kernel = r.kernel(self._device)
        self._bound = None  # its source belongs to the weight this state replaces

    def _loaded(self) -> None:
        self._prepared = None
        tensors = [t for t in (self._buffers.get(n) for n in self._names) if t is not None]
        if tensors and tensors[0].device != self._device:  # assign=True brought them from elsewhere
            self._moved_to(tensors[0].device)

    # --- moving ----------------------------------------------------------------------------

    def _apply(self, fn: Any, recurse: bool = True) -> QuantModule:
        if recurse:
            for child in self.children():
                child._apply(fn)
        target: torch.device | None = None
        for name, buf in list(self._buffers.items()):
            if buf is None or self._stays(name):
                continue
            probe = fn(torch.empty(0, dtype=buf.dtype, device=buf.device))
            target = probe.device
            # Never cast: a prepared layout's dtypes are part of it.
            self._buffers[name] = fn(buf) if probe.dtype == buf.dtype else buf.to(probe.device)
        if target is None:
            target = fn(torch.empty(0, device=self._device)).device
        self._moved_to(target)
        return self

    def _stays(self, name: str) -> bool:
        """Buffers a move leaves where they are (the offloaded pass of TurboQuant)."""
        return False

    def _moved_to(self, device: torch.device) -> None:
        self._prepared = None
        device = _concrete(device)
        if device == self._device:
            return
        self._device = device
        if self.kernel is None:
            return
        if self.keep_source and device.type != "meta":
            source = {n[len(SOURCE):]: t for n, t in self._buffers.items() if n.startswith(SOURCE) and t is not None}
            if source:
                self.bind_tensors(source, prefer=self._prefer)
                return
        kernel_cls = type(self.kernel)
        if device.type == "meta" or device.type in kernel_cls.requires.device_types:
            self.kernel = kernel_cls(self.format, device)
            self._unusable = None
        else:
            self._unusable = (
                f"{type(self).__name__}: {kernel_cls.name} prepared this {self.format.slug} weight in its "
                f"layout for {'/'.join(sorted(kernel_cls.requires.device_types))} and cannot run it on {device}; "
                f"build the module on {device.type} (or with keep_source=True to prepare again after a move)"
            )

    def extra_repr(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        kernel = self.kernel.name if self.kernel is not None else None
        return f"{dims}, format={self.format.slug}, kernel={kernel}"


def _concrete(device: str | torch.device) -> torch.device:
    """``cuda`` as the ``cuda:N`` it means now, so that a move to where the module is
    already is recognised as none."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return d
