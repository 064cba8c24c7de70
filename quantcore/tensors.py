"""Checks for named tensors: shape, dtype, device, values, with messages that name them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from .errors import KernelInputError, TensorFormatError, UnsupportedProblemError

__all__ = [
    "ALIGNMENT",
    "check_activation",
    "check_stored",
    "describe",
    "ieee_div",
    "laid_out",
    "reject_unknown",
    "require_float_weight",
    "require_representable",
    "require_tensor",
    "require_tensors",
    "stored_on",
    "traced",
    "version_of",
]


#: Bytes a prepared tensor's start is aligned to: what any kernel's vector loads need.
ALIGNMENT = 16


def laid_out(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``prepare`` lays a tensor out: contiguous, its start aligned to
    :data:`ALIGNMENT` bytes. A view (non-contiguous, at a storage offset) that an op would
    read as if it were laid out — ``aten._weight_int4pack_mm_for_cpu`` reads the storage,
    Triton kernels load 16-byte vectors — is copied, once, where it comes in."""
    if t.device.type == "meta" or (t.is_contiguous() and t.data_ptr() % ALIGNMENT == 0):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def traced(x: torch.Tensor) -> bool:
    """True when a call must be made of ops a tracer sees: under ``torch.compile`` /
    ``torch.export``, or on a fake, meta or other tensor subclass (shape inference,
    tracing). Eager calls on plain tensors may take a faster route of their own."""
    return torch.compiler.is_compiling() or type(x) is not torch.Tensor or x.is_meta


def version_of(t: torch.Tensor) -> int:
    """``t``'s version counter (bumped by every in-place change) where it has one: -1 while
    tracing (not a value a graph can guard on) and for inference tensors (they have none)."""
    if torch.compiler.is_compiling() or t.is_inference():
        return -1
    return t._version


def describe(t: torch.Tensor) -> str:
    """``(512, 4096) int32 on cpu`` — how a tensor is named in error messages."""
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} on {t.device}"


def check_stored(tensors: object, *, where: str, one_device: bool = True) -> None:
    """What every set of stored tensors must be, whatever the format: a mapping from
    names to tensors that hold data (a ``meta`` tensor has a shape and no values to
    validate or compute with), all on one device."""
    if not isinstance(tensors, Mapping):
        raise TensorFormatError(f"{where}: tensors: expected a mapping of names to tensors, got {type(tensors).__name__}")
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TensorFormatError(f"{where}: tensors: expected str names, got {name!r}")
        if not isinstance(t, torch.Tensor):
            raise TensorFormatError(f"{where}: {name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type == "meta":
            raise TensorFormatError(f"{where}: {name}: a meta tensor holds no data, got {describe(t)}")
    devices = {t.device for t in tensors.values()}
    if one_device and len(devices) > 1:
        by_device = ", ".join(f"{n} on {t.device}" for n, t in tensors.items())
        raise TensorFormatError(f"{where}: tensors: expected one device, got {by_device}")


def stored_on(
    tensors: Mapping[str, torch.Tensor], device: torch.device, *, where: str
) -> dict[str, torch.Tensor]:
    """The stored tensors moved to ``device`` (a kernel's ``prepare``), after checking
    that they are tensors with data; the format's ``validate`` checks the rest."""
    check_stored(tensors, where=where, one_device=False)
    out = {}
    for name, t in tensors.items():
        try:
            out[name] = t.to(device)
        except (RuntimeError, AssertionError) as exc:  # no such device in this build or machine
            raise UnsupportedProblemError(f"{where}: {name}: cannot be moved to {device} ({exc})") from None
    return out


def check_activation(
    x: object,
    *,
    k: int,
    dtypes: Sequence[torch.dtype],
    device: torch.device,
    name: str = "x",
) -> torch.Tensor:
    """An activation ``[..., k]`` in one of ``dtypes`` on ``device``, else
    :class:`~quantcore.errors.KernelInputError` saying what was expected and what came."""
    from .dtypes import dtype_name

    wanted = "/".join(dtype_name(d) for d in dtypes)
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"{name}: expected a [..., {k}] {wanted} tensor on {device}, got {type(x).__name__}")
    if x.dim() < 1 or x.shape[-1] != k or x.dtype not in dtypes or x.device != device:
        raise KernelInputError(f"{name}: expected [..., {k}] {wanted} on {device}, got {describe(x)}")
    return x


def require_float_weight(weight: object, *, ndim: int, layout: str, where: str = "weight") -> torch.Tensor:
    """A dense float weight for a golden quantizer: a non-empty, finite ``ndim``-D float
    tensor with data."""
    if not isinstance(weight, torch.Tensor):
        raise TensorFormatError(f"{where}: expected a {ndim}-D float {layout} tensor, got {type(weight).__name__}")
    if weight.dim() != ndim or not weight.is_floating_point() or weight.numel() == 0 or weight.device.type == "meta":
        raise TensorFormatError(f"{where}: expected a non-empty {ndim}-D float {layout} tensor with data, got {describe(weight)}")
    # isfinite has no kernel for the 8-bit floats: check those as float32.
    if not torch.isfinite(weight if weight.element_size() > 1 else weight.float()).all():
        raise TensorFormatError(f"{where}: contains NaN or Inf; cannot quantize")
    return weight


def require_representable(stored: torch.Tensor, what: str, weight: torch.Tensor, dtype: torch.dtype) -> None:
    """A golden quantizer's ``stored`` metadata (scales, zeros) must be finite in the
    ``dtype`` the format stores it in; else the weight's range is beyond the format."""
    if not torch.isfinite(stored).all():
        top = weight.detach().float().abs().max().item()
        raise TensorFormatError(
            f"weight: values up to {top:.3g} need {what} beyond {str(dtype).removeprefix('torch.')}'s "
            "range; the format cannot store this weight"
        )


def reject_unknown(
    tensors: Mapping[str, torch.Tensor], known: Iterable[str], *, where: str, takes: str
) -> None:
    """Refuse tensor names a format does not define; ``takes`` says what it does take."""
    unknown = sorted(set(tensors) - set(known))
    if unknown:
        raise TensorFormatError(f"{where}: unexpected tensor(s) {', '.join(unknown)}; {takes}")


def require_tensors(
    tensors: Mapping[str, torch.Tensor], names: Iterable[str], *, where: str
) -> None:
    missing = [n for n in names if n not in tensors]
    if missing:
        raise TensorFormatError(
            f"{where}: missing tensor(s) {', '.join(missing)}; got {sorted(tensors)}"
        )


def require_tensor(
    name: str,
    t: object,
    *,
    shape: Sequence[int] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    where: str = "",
    error: type[Exception] = TensorFormatError,
) -> torch.Tensor:
    """Return ``t`` if it is a tensor with this shape and one of these dtypes, else raise."""
    prefix = f"{where}: " if where else ""
    if not isinstance(t, torch.Tensor):
        raise error(f"{prefix}{name}: expected a torch.Tensor, got {type(t).__name__}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise error(f"{prefix}{name}: expected shape {tuple(shape)}, got {describe(t)}")
    if dtypes is not None and t.dtype not in dtypes:
        wanted = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise error(f"{prefix}{name}: expected dtype {wanted}, got {describe(t)}")
    return t


def ieee_div(a: torch.Tensor | float, b: torch.Tensor | float) -> torch.Tensor:
    """IEEE float32 ``a / b``, elementwise, on every device. Written out because torch
    computes ``scalar / tensor`` as ``reciprocal(tensor) · scalar`` (two roundings), and
    CUDA may turn ``tensor / scalar`` into a product with the scalar's reciprocal."""
    ta = a if isinstance(a, torch.Tensor) else None
    tb = b if isinstance(b, torch.Tensor) else None
    like = ta if ta is not None else tb
    assert like is not None
    ta = ta if ta is not None else torch.full_like(like, float(a))  # type: ignore[arg-type]
    tb = tb if tb is not None else torch.full_like(like, float(b))  # type: ignore[arg-type]
    return torch.div(ta, tb)
