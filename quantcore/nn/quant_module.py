"""The base of quantcore's torch modules: one weight of an op kind, held as one kernel's
prepared state.

A :class:`QuantModule` is bound once — the kernel for the module's device and
activation dtype is chosen down the ranking of :mod:`quantcore.selection` and prepares the
weight (:func:`quantcore.binding.prepare_best`) — and from then on holds that kernel and
its prepared state, once: the state's tensors are the module's buffers
(:mod:`quantcore.custom_ops.state` flattens it), and the prepared object built on them is
a plain attribute. So:

* ``state_dict()`` is the prepared state plus, as ``_extra_state``, the op spec naming the
  kernel and how its tensors fit together; ``load_state_dict`` rebuilds any module of
  the same shape from it, including a skeleton built on ``meta`` and loaded with
  ``assign=True``, whatever kernel it had before — after checking every buffer and the
  spec against what that kernel's ``prepare`` makes (:mod:`.incoming`);
* ``.to()`` / ``.cuda()`` move the buffers and never cast them (a dtype change would
  corrupt a kernel's layout: integer codes stay, float scales keep their precision);
  where the kernel cannot run on the new device the module says so at its next call,
  or, with ``keep_source=True``, prepares again there;
* the checkpoint's tensors are dropped once prepared (memory is the prepared bytes),
  unless ``keep_source=True`` keeps them for a run-time fallback: a kernel that fails in a
  call is recorded as failed on the device and the next candidate prepared from them.

A call has two routes. While traced — ``torch.compile`` (one op, no graph break),
``torch.export`` (the buffers are the graph's buffers), fake or meta tensors — it is the
op kind's custom op (``quantcore::linear`` …). Otherwise it is the kernel called on the
prepared state. What does not depend on the call's inputs — whether anything blocks the
module, whether the kernel's output was checked, whether a kept source could replace a
failing kernel — is decided by the first call after the kernel or its state changes; from
then on a call is one attribute test, the trace test and the kernel's call (the kernel
checks its own input, so every check that protects memory stays).

The op kind's declaration (:class:`quantcore.ops.Op`) gives the module its weight dims,
its problem and its op, so ``QuantModule(fmt, tensors)`` runs any op kind (``fmt.op``);
the subclasses give an op kind its constructor arguments and its methods.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, cast

import torch
from torch import nn
from torch.nn.modules import module as _module

from ..binding import CALLERS_FAULT, call_failed, prepare_best
from ..custom_ops import call_op, flatten, make_spec, resolve, traced, unflatten
from ..errors import (
    InvalidArgumentError,
    KernelInputError,
    PluginError,
    QuantCoreError,
    TensorFormatError,
)
from ..formats.base import Format
from ..kernel import Kernel
from ..ops import get_op
from ..probe import normalize_device, probe
from ..problem import Problem, check_dims
from ..registry import default_registry
from ..tensors import describe, laid_out
from .incoming import EXTRA_STATE_VERSION, SOURCE, TAKEN_PREFIX, check_incoming, read_extra_state

__all__ = ["SOURCE", "QuantModule", "runs_hooks"]

#: Held while a module replaces a kernel that failed in a call (threads calling one module).
_replacing = threading.Lock()


def runs_hooks(*modules: nn.Module | None) -> bool:
    """Whether calling one of ``modules`` would run a forward hook (its own or a global
    one), the test ``nn.Module.__call__`` makes for its own fast path: a caller that skips
    a module's call for a fused path takes the call instead where one would run."""
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return True
    for m in modules:  # noqa: SIM110 (any() over a generator is one more Python frame a call)
        if m is not None and (m._forward_hooks or m._forward_pre_hooks):
            return True
    return False


class QuantModule(nn.Module):
    """One weight of an op kind, run by one kernel: ``forward(*inputs, **options)`` is the
    kernel's call without the prepared state (``layer(x)``; ``experts(x, topk_ids,
    topk_weights=w)``). Built from a checkpoint's ``tensors`` it binds at once; built from
    ``dims`` (the op's weight dims) it is a skeleton for ``load_state_dict``."""

    #: The op kind the module runs (``"linear"``, ``"moe"``, …); None: the format's.
    op_kind: ClassVar[str | None] = None

    def __init__(
        self,
        fmt: Format,
        tensors: Mapping[str, torch.Tensor] | None = None,
        *,
        dims: Mapping[str, int] | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = torch.bfloat16,
        prefer: str | Sequence[str] | None = None,
        keep_source: bool = False,
    ) -> None:
        super().__init__()
        op = get_op(self.op_kind or fmt.op)
        if fmt.op != op.name:
            raise InvalidArgumentError(f"fmt: {type(self).__name__} runs {op.name}; {fmt.slug} is a {fmt.op} format")
        if tensors is not None:
            found = fmt.validate(tensors)  # the one validation of the tensors on their way in
            dims = {d: found[d] for d in op.weight_dims}
            if device is None:
                device = next(iter(tensors.values())).device
        elif dims is None or set(dims) != set(op.weight_dims):
            raise InvalidArgumentError(
                f"{type(self).__name__}: give the checkpoint's tensors, or the weight dims {list(op.weight_dims)} "
                f"(got {dict(dims) if dims is not None else None})"
            )
        #: The op kind's declaration: its weight dims, output rule and custom op.
        self.op = op
        self.format = fmt
        #: The problem dims of the weight (K, N for a linear; E, K, N for a MoE GEMM, …).
        self.dims = dict(check_dims(dims))
        #: The activation dtype the kernel was chosen and prepared for.
        self.dtype = dtype
        self.keep_source = keep_source
        self.kernel: Kernel | None = None
        #: The kernel's prepared state, built on the buffers.
        self.prepared: Any = None
        #: (kernel, reason) for every candidate passed over for this weight.
        self.passed_over: list[tuple[str, str]] = []
        self._spec = ""
        self._names: tuple[str, ...] = ()
        #: The kernel whose first output was found of the op's shape and dtype.
        self._output_checked: Kernel | None = None
        #: The kernel an eager call runs with nothing around it: set by a call of
        #: :meth:`_forward_checked` that found nothing blocking, the output checked and no
        #: kept source to fall back on; None (every call checked) from any change of the
        #: kernel, its prepared state or what blocks the module until then.
        self._direct: Kernel | None = None
        self._prefer = _preferences(prefer)
        self._device = _concrete(device if device is not None else "cpu")
        if self._device.type != "meta":
            caps = probe(self._device)
            if not caps.available:
                raise InvalidArgumentError(f"device: {self._device} is not available here ({caps.reason})")
        #: Why an eager call cannot run now (no weight yet, or moved where the kernel cannot
        #: run); None when it can.
        self._blocked: str | None = self._no_weight()
        if tensors is not None:
            self._bind(tensors)

    # --- binding ---------------------------------------------------------------------------

    def problem(self) -> Problem:
        """The problem the kernel is chosen for: the weight's dims, no batch dim."""
        return Problem.of(self.format, self.dims, self.dtype or torch.float32, op=self.op.name)

    def bind_tensors(
        self, tensors: Mapping[str, torch.Tensor], *, prefer: str | Sequence[str] | None = None
    ) -> None:
        """Choose and prepare the kernel for ``tensors`` (a checkpoint's, validated by the
        format against the module's dims) on this module's device, and hold its prepared state."""
        dims = self.format.validate(tensors)
        mismatch = {k: (v, dims.get(k)) for k, v in self.dims.items() if dims.get(k) != v}
        if mismatch:
            said = ", ".join(f"{k}={got} (module: {want})" for k, (want, got) in mismatch.items())
            raise TensorFormatError(f"{self.format.slug} tensors: they describe {said}")
        self._prefer = _preferences(prefer)
        self._bind(tensors)

    def _bind(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Prepare validated ``tensors`` with the best kernel that takes them."""
        if self._device.type == "meta":
            raise KernelInputError("device: a module on meta cannot prepare weights; build it on a real device")
        source = {k: v.detach().to(self._device) for k, v in tensors.items()}
        passed_over: list[tuple[str, str]] = []
        kernel, prepared = prepare_best(self.format, normalize_device(self._device), source, problem=self.problem(),
                                        dtype=self.dtype, prefer=self._prefer, registry=default_registry(),
                                        passed_over=passed_over)
        self._drop_source()
        if self.keep_source:
            for name, t in source.items():
                self.register_buffer(SOURCE + name, t, persistent=False)
        self.passed_over = passed_over
        self._adopt(kernel, prepared)

    def _adopt(self, kernel: Kernel, prepared: Any) -> None:
        state = flatten(prepared, where=f"{kernel.name}.prepare()")
        for name in self._names:
            self._buffers.pop(name, None)
        names = tuple(self._free_name(n) for n in state.names)
        for name, t in zip(names, state.tensors, strict=True):
            self.register_buffer(name, t)
        self._names = names
        self._spec = make_spec(kernel, state, self.dims)
        self.kernel, self.prepared, self._blocked, self._direct = kernel, prepared, None, None

    def _free_name(self, name: str) -> str:
        return f"{TAKEN_PREFIX}{name}" if self._taken(name) or name.startswith(SOURCE) else name

    def _taken(self, name: str) -> bool:
        """Whether a buffer called ``name`` would shadow something of the module."""
        return hasattr(type(self), name) or name in self.__dict__ or name in self._modules \
            or name in self._parameters or (name in self._buffers and name not in self._names)

    def _source(self) -> dict[str, torch.Tensor]:
        """The kept checkpoint tensors (empty unless ``keep_source``)."""
        return {n[len(SOURCE):]: t for n, t in self._buffers.items() if n.startswith(SOURCE) and t is not None}

    def _drop_source(self) -> None:
        for name in [n for n in self._buffers if n.startswith(SOURCE)]:
            del self._buffers[name]

    def _rebuild(self) -> None:
        """The prepared state again, on the buffers as they are now (after a move or a
        load), checked against the kernel's schema where the kernel can run them."""
        self._direct = None
        if not self._spec or self._blocked is not None:
            return
        held = {n: self._buffers.get(n) for n in self._names}
        missing = [n for n, t in held.items() if t is None]
        if missing:
            self.prepared, self._blocked = None, f"{type(self).__name__}: buffer {missing[0]} of the prepared state is missing"
            return
        state = [t for t in held.values() if t is not None]
        r = resolve(self._spec)
        try:
            if state and state[0].device.type == "meta":  # shapes only: for tracing, nothing runs
                self.prepared = unflatten(r.tree, state, allowed=r.allowed)
            else:
                self.prepared = r.prepared(state, where=type(self).__name__, names=list(self._names),
                                           one_device=not any(self._stays(n) for n in self._names))
        except QuantCoreError as exc:
            self.prepared, self._blocked = None, str(exc)
            raise

    def state_tensors(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self._names]

    @property
    def has_weight(self) -> bool:
        return bool(self._spec)

    def _no_weight(self) -> str:
        return f"{type(self).__name__}: no weight yet; load a state dict or bind the checkpoint's tensors"

    # --- calling ---------------------------------------------------------------------------

    def forward(self, *inputs: Any, **options: Any) -> Any:
        kernel = self._direct
        if kernel is not None and inputs and not traced(inputs[0]):
            return kernel(*inputs, self.prepared, **options)
        return self._forward_checked(inputs, options)

    def _forward_checked(self, inputs: tuple[Any, ...], options: dict[str, Any]) -> Any:
        """A call off the direct route: traced (the custom op), blocked, the kernel's first
        call (its output checked), or a call a kept source may rescue."""
        if not inputs:
            raise KernelInputError(f"{type(self).__name__}: expected the op's inputs {list(self.op.inputs)}, got none")
        if traced(inputs[0]):
            if not self._spec:
                raise KernelInputError(self._no_weight())
            return call_op(self.op.name, self._spec, self.state_tensors(), *inputs, **options)
        if self._blocked is not None:
            raise KernelInputError(self._blocked)
        kernel = self.kernel
        if kernel is None:  # a module holds a kernel whenever nothing blocks its calls
            raise KernelInputError(self._no_weight())
        try:
            out = kernel(*inputs, self.prepared, **options)
        except Exception as exc:
            if not self.keep_source or isinstance(exc, CALLERS_FAULT) or not self._source():
                raise
            self._replace_failed(kernel, exc)
            return self.forward(*inputs, **options)
        if self._output_checked is not kernel:  # its first call: is the answer of the op's shape?
            wrong = self.op.output_problem(self.format, self.dims, inputs, options, out)
            if wrong:
                why = f"its first call returned a wrong result: {wrong}"
                if not self.keep_source or not self._source():
                    raise PluginError(f"{kernel.name}: {why} (build the module with keep_source=True to fall back)")
                self._replace_failed(kernel, None, why)
                return self.forward(*inputs, **options)
            self._output_checked = kernel
        if not self.keep_source and kernel is self.kernel:  # nothing to fall back on: later calls go straight to it
            self._direct = kernel
        return out

    def _replace_failed(self, kernel: Kernel, exc: Exception | None, reason: str = "") -> None:
        """``kernel`` raised in a call (or answered what its op never returns:
        ``reason``): recorded as failed on this device, and the next candidate prepared
        from the kept source (a failed call produced no usable output, so running it again
        on another kernel is safe)."""
        with _replacing:
            if self.kernel is not kernel:  # another thread replaced it already
                return
            device, registry = normalize_device(self._device), default_registry()
            call_failed(self.format, device, self.problem(), kernel, exc, registry=registry,
                        passed_over=self.passed_over, reason=reason)
            kernel, prepared = prepare_best(self.format, device, self._source(), problem=self.problem(),
                                            dtype=self.dtype, prefer=self._prefer, registry=registry,
                                            passed_over=self.passed_over)
            self._adopt(kernel, prepared)

    # --- state dict ------------------------------------------------------------------------

    def get_extra_state(self) -> dict[str, Any]:
        return {"version": EXTRA_STATE_VERSION, "spec": self._spec, "names": list(self._names)}

    def set_extra_state(self, state: Any) -> None:
        """Torch calls this after the buffers were loaded; ``_load_from_state_dict`` read
        and checked the same state before. Called on its own, it takes only the layout the
        module holds now, checked against its buffers."""
        spec, names = self._read_extra(state, type(self).__name__)
        if (spec, names) != (self._spec, self._names):
            raise TensorFormatError(
                f"{type(self).__name__}: _extra_state: describes another prepared state than the module holds; "
                "load it with load_state_dict, together with its buffers"
            )

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, local_metadata: Any, strict: bool,
        missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str],
    ) -> None:
        where = prefix.rstrip(".") or type(self).__name__
        key = prefix + "_extra_state"
        if key in state_dict:
            spec, names = self._read_extra(state_dict[key], where)
        else:
            spec, names = self._spec, self._names
        if spec:
            given = [state_dict.get(prefix + n) for n in names]
            if key in state_dict or any(t is not None for t in given):
                if key not in state_dict:  # some buffers of the layout held now
                    given = [self._buffers.get(n) if t is None else t for n, t in zip(names, given, strict=True)]
                assign = bool(local_metadata.get("assign_to_params_buffers", False))
                if not assign and (spec, names) == (self._spec, self._names):
                    self._check_same_dtypes(names, given, prefix)
                self._check_incoming(spec, names, given, prefix, where, assign)
                if assign:  # kept as they come: views become laid-out copies (torch passes a dict of our own)
                    for n, t in zip(names, given, strict=True):
                        if prefix + n in state_dict:
                            # check_incoming refused any that is not a tensor
                            state_dict[prefix + n] = laid_out(cast(torch.Tensor, t))
                if (spec, names) != (self._spec, self._names):
                    self._restructure(spec, names, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        self._loaded()

    def _read_extra(self, extra: Any, where: str) -> tuple[str, tuple[str, ...]]:
        return read_extra_state(extra, where, fmt=self.format, dims=self.dims, op=self.op.name,
                                usable=lambda n: n in self._names or not self._taken(n))

    def _check_same_dtypes(self, names: tuple[str, ...], given: list[Any], prefix: str) -> None:
        """Without ``assign`` torch copies each tensor into the buffer held, casting it: a
        tensor of another dtype would change the values silently (a bf16 bias into an fp16
        one), even where the kernel's schema takes either dtype."""
        for n, t in zip(names, given, strict=True):
            held = self._buffers.get(n)
            if isinstance(t, torch.Tensor) and held is not None and t.dtype != held.dtype:
                raise TensorFormatError(
                    f"{prefix}{n}: expected {str(held.dtype).removeprefix('torch.')} (the buffer the module holds; "
                    f"loading copies into it), got {describe(t)}; load with assign=True to take it as it is"
                )

    def _check_incoming(self, spec: str, names: tuple[str, ...], given: list[Any], prefix: str, where: str,
                        assign: bool) -> None:
        check_incoming(spec, names, given, prefix=prefix, where=where, assign=assign, module_device=self._device)

    def _restructure(self, spec: str, names: tuple[str, ...], state_dict: Mapping[str, Any], prefix: str) -> None:
        """Take the buffer layout (and kernel) the incoming state dict describes."""
        for name in self._names:
            self._buffers.pop(name, None)
        self._names = names
        for name in self._names:
            incoming = state_dict.get(prefix + name)
            if isinstance(incoming, torch.Tensor):
                self.register_buffer(name, torch.empty_like(incoming, device=self._device))
        self._spec, self._direct = spec, None
        kernel_cls = resolve(spec).kernel_cls
        self.kernel, self._blocked = resolve(spec).kernel(self._device), self._cannot_run(kernel_cls, self._device)
        self._drop_source()  # it belongs to the weight this state replaces

    def _loaded(self) -> None:
        tensors = [t for t in (self._buffers.get(n) for n in self._names) if t is not None]
        if tensors and tensors[0].device != self._device:  # assign=True brought them from elsewhere
            self._moved_to(tensors[0].device)
        else:
            self._rebuild()

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
        device = _concrete(device)
        if device != self._device:
            self._device = device
            if self.kernel is not None:
                source = self._source()
                if self.keep_source and device.type != "meta" and source:
                    self._bind(source)
                    return
                kernel_cls = type(self.kernel)
                self._blocked = self._cannot_run(kernel_cls, device)
                if self._blocked is None:
                    self.kernel = kernel_cls(self.format, device)
        self._rebuild()

    def _cannot_run(self, kernel_cls: type[Kernel], device: torch.device) -> str | None:
        """Why ``kernel_cls`` cannot run this module's weight on ``device``, or None: another
        device type, or what the device lacks that the kernel needs (a package, a release of
        it; a state prepared where they were, loaded where they are not)."""
        if device.type == "meta":
            return None
        if device.type not in kernel_cls.requires.device_types:
            return (
                f"{type(self).__name__}: {kernel_cls.name} prepared this {self.format.slug} weight in its "
                f"layout for {'/'.join(sorted(kernel_cls.requires.device_types))} and cannot run it on "
                f"{device}; build the module on {device.type} (or with keep_source=True to prepare again "
                "after a move)"
            )
        try:
            why = kernel_cls.check_device(probe(device))
        except Exception as exc:  # a plugin's check that raises: its kernel cannot be trusted to run
            why = f"its device check raised {type(exc).__name__}: {exc}"
        if why is None:
            return None
        return (
            f"{type(self).__name__}: {kernel_cls.name} prepared this {self.format.slug} weight in its layout "
            f"and cannot run it on {device}: {why}; build the module where it runs (or with keep_source=True "
            "to prepare again)"
        )

    def extra_repr(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        kernel = self.kernel.name if self.kernel is not None else None
        return f"{dims}, format={self.format.slug}, kernel={kernel}"


def _preferences(prefer: str | Sequence[str] | None) -> tuple[str, ...]:
    return (prefer,) if isinstance(prefer, str) else tuple(prefer or ())


def _concrete(device: str | torch.device) -> torch.device:
    """``cuda`` as the ``cuda:N`` it means now, so that a move to where the module is
    already is recognised as none."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidArgumentError(f"device: expected a device such as 'cpu' or 'cuda:0', got {device!r} ({exc})") from None
    if d.type == "cuda" and d.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return d
