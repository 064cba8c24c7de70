"""Bad inputs, generated: mutations of a format's stored tensors and of a kernel's
activation, each described in words for the failure message.

Three families, applied alike to every format (nothing here names one):

* layout   same values, another memory layout: non-contiguous, a storage offset
           (misaligned for vector loads), a view of a larger buffer;
* values   same shape and dtype, other values: random bit patterns, the dtype's
           extremes, NaN / ±Inf, huge, zero, subnormal, overlapping (stride-0 and
           shifted-window) views;
* structure  wrong shape (a dim more or less, one element short, doubled, emptied,
           transposed), wrong dtype, wrong device, not a tensor, a tensor missing or
           unknown, tensors from another format.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from hypothesis import strategies as st

from .profiles import DEVICE as FUZZ_DEVICE

__all__ = [
    "ALL_DTYPES",
    "FLOAT_DTYPES",
    "OTHER_DEVICE",
    "mutate_activation",
    "mutate_tensor",
    "mutate_tensors",
    "noncontiguous",
    "offset_view",
]

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ALL_DTYPES = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.float8_e4m3fn, torch.float8_e5m2,
)
#: A device the tensors can be moved to that is not the kernel's: the CPU when fuzzing on
#: a GPU; else CUDA where present, otherwise ``meta`` (shape without data).
OTHER_DEVICE = "cpu" if FUZZ_DEVICE != "cpu" else "cuda" if torch.cuda.is_available() else "meta"

Tensors = dict[str, Any]


def _gen(data: st.DataObject) -> torch.Generator:
    return torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))


# --- layout: same values ----------------------------------------------------------------------


def noncontiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout (every element stride doubled)."""
    if t.dim() == 0 or t.numel() < 2:
        return t.clone()
    buf = torch.zeros(t.numel() * 2, dtype=t.dtype, device=t.device)
    strides = [1] * t.dim()
    for d in range(t.dim() - 2, -1, -1):
        strides[d] = strides[d + 1] * t.shape[d + 1]
    view = buf.as_strided(t.shape, [2 * s for s in strides])
    view.copy_(t)
    return view


def transposed_layout(t: torch.Tensor) -> torch.Tensor:
    """The same values, stored column-major (``t.mT.contiguous().mT``)."""
    return t.mT.contiguous().mT if t.dim() >= 2 else noncontiguous(t)


def offset_view(t: torch.Tensor, offset: int = 3) -> torch.Tensor:
    """The same values at a storage offset: contiguous but misaligned for vector loads."""
    buf = torch.zeros(t.numel() + offset, dtype=t.dtype, device=t.device)
    view = buf[offset:].view(t.shape)
    view.copy_(t)
    return view


LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "non-contiguous": noncontiguous,
    "column-major": transposed_layout,
    "storage offset": offset_view,
}


# --- values ---------------------------------------------------------------------------------------


def _random_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random values of ``t``'s shape and dtype, on its device (drawn on the CPU, where
    the generator lives; a meta tensor has no values to draw)."""
    if t.device.type == "meta":
        return torch.empty_like(t)
    if t.dtype == torch.bool:
        out = torch.randint(0, 2, t.shape, generator=gen).bool()
    elif t.is_complex():
        out = torch.randn(t.shape, generator=gen, dtype=t.dtype)
    elif t.is_floating_point():
        top = t.float().abs().max().clamp_min(1e-3).item() if t.numel() else 1.0  # an empty tensor has no max
        out = (torch.randn(t.shape, generator=gen) * top).to(t.dtype)
    else:
        info = torch.iinfo(t.dtype)
        lo, hi = max(info.min, -(2**62)), min(info.max, 2**62)
        out = torch.randint(lo, hi, t.shape, generator=gen, dtype=torch.int64).to(t.dtype)
    return out.to(t.device)


def _extreme_like(t: torch.Tensor, which: str) -> torch.Tensor:
    if t.dtype == torch.bool:
        return torch.full_like(t, which == "max")
    if t.is_complex():
        return torch.full_like(t, 3e38 if which == "max" else -3e38)
    info = torch.finfo(t.dtype) if t.is_floating_point() else torch.iinfo(t.dtype)
    return torch.full_like(t, info.max if which == "max" else info.min)


def _poke(t: torch.Tensor, value: float, gen: torch.Generator, count: int) -> torch.Tensor:
    out = t.detach().double().contiguous().clone()  # float8 has no indexed writes
    if out.numel():
        flat = out.view(-1)
        idx = torch.randint(0, flat.numel(), (count,), generator=gen)
        flat[idx] = value
    return out.to(t.dtype).reshape(t.shape)


def _overlap_rows(t: torch.Tensor) -> torch.Tensor:
    """Every index along dim 0 reads the first slice (stride 0)."""
    return t.narrow(0, 0, 1).expand(t.shape) if t.dim() and t.shape[0] else t


def _overlap_windows(t: torch.Tensor) -> torch.Tensor:
    """Row r is the window ``base[r : r + C]`` of one buffer: rows overlap in memory."""
    if t.dim() != 2 or t.numel() == 0:
        return _overlap_rows(t)
    r, c = t.shape
    base = t.reshape(-1)[: r + c - 1].clone() if t.numel() >= r + c - 1 else torch.zeros(r + c - 1, dtype=t.dtype)
    return base.as_strided((r, c), (1, 1))


def value_mutations(t: torch.Tensor) -> list[str]:
    kinds = ["random bits", "max", "min", "overlapping rows", "overlapping windows", "zero"]
    if t.is_floating_point():
        kinds += ["nan", "+inf", "-inf", "huge", "subnormal", "negated"]
    if t.is_complex():
        kinds = ["random bits", "zero", "overlapping rows"]
    return kinds


def mutate_values(t: torch.Tensor, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "random bits":
        return _random_like(t, gen)
    if kind in ("max", "min"):
        return _extreme_like(t, kind)
    if kind == "overlapping rows":
        return _overlap_rows(t)
    if kind == "overlapping windows":
        return _overlap_windows(t)
    if kind == "zero":
        return torch.zeros_like(t)
    if kind == "nan":
        return _poke(t, float("nan"), gen, 1)
    if kind == "+inf":
        return _poke(t, float("inf"), gen, 1)
    if kind == "-inf":
        return _poke(t, float("-inf"), gen, 1)
    if kind == "huge":
        big = torch.finfo(t.dtype).max
        top = t.float().abs().max().item() if t.numel() else 1.0
        factor = big / max(top, 1e-30) * 0.5
        return (t.double() * factor).clamp(-big, big).to(t.dtype)
    if kind == "subnormal":
        return torch.full_like(t, torch.finfo(t.dtype).smallest_normal / 4)
    if kind == "negated":
        return (-t.double()).to(t.dtype)
    raise ValueError(kind)


# --- structure ------------------------------------------------------------------------------------


def shape_mutations(t: torch.Tensor) -> list[str]:
    kinds = ["unsqueeze", "flatten", "scalar"]
    if t.dim():
        kinds += ["one short", "doubled", "emptied"]
    if t.dim() >= 2:
        kinds += ["transposed"]
    return kinds


def mutate_shape(t: torch.Tensor, kind: str, dim: int) -> torch.Tensor:
    d = dim % t.dim() if t.dim() else 0
    if kind == "unsqueeze":
        return t.unsqueeze(0)
    if kind == "flatten":
        return t.reshape(-1)
    if kind == "scalar":
        return t.reshape(-1)[0].clone() if t.numel() else torch.zeros((), dtype=t.dtype)
    if kind == "one short":
        return t.narrow(d, 0, max(t.shape[d] - 1, 0))
    if kind == "doubled":
        return torch.cat([t, t], dim=d)
    if kind == "emptied":
        return t.narrow(d, 0, 0)
    if kind == "transposed":
        return t.mT.contiguous()
    raise ValueError(kind)


def retype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex -> real drops the imaginary part: meant
            return t.to(dtype)
    except (RuntimeError, TypeError):  # a conversion torch lacks: not a case we can make
        return None


NOT_TENSORS: tuple[Any, ...] = (None, 3, 2.5, "qweight", [1, 2, 3], (), {"a": 1})


def mutate_tensor(data: st.DataObject, name: str, t: Any, gen: torch.Generator) -> tuple[str, Any]:
    """One mutation of one tensor: ``(description, new value)``."""
    if not isinstance(t, torch.Tensor):
        return f"{name}: replaced by a tensor", torch.zeros(4)
    family = data.draw(st.sampled_from(("layout", "values", "shape", "dtype", "device", "not a tensor", "grad")), label="family")
    if family == "layout":
        kind = data.draw(st.sampled_from(sorted(LAYOUTS)), label="layout")
        return f"{name}: {kind}", LAYOUTS[kind](t)
    if family == "values":
        kind = data.draw(st.sampled_from(value_mutations(t)), label="values")
        if t.device.type == "meta":  # no values to change
            return f"{name}: values {kind} (meta: unchanged)", t
        return f"{name}: values {kind}", mutate_values(t, kind, gen)
    if family == "shape":
        kind = data.draw(st.sampled_from(shape_mutations(t)), label="shape")
        dim = data.draw(st.integers(0, 3), label="dim")
        new = mutate_shape(t, kind, dim)
        return f"{name}: shape {kind} (dim {dim}) {tuple(t.shape)} -> {tuple(new.shape)}", new
    if family == "dtype":
        dtype = data.draw(st.sampled_from([d for d in ALL_DTYPES if d != t.dtype]), label="dtype")
        new = retype(t, dtype)
        if new is None:
            return f"{name}: dtype {dtype} (no conversion; made empty-valued)", torch.zeros(t.shape, dtype=dtype)
        return f"{name}: dtype {t.dtype} -> {dtype}", new
    if family == "device":
        return f"{name}: moved to {OTHER_DEVICE}", t.to(OTHER_DEVICE)
    if family == "grad":
        if t.is_floating_point():
            return f"{name}: requires_grad", t.detach().clone().requires_grad_(True)
        return f"{name}: {sorted(LAYOUTS)[0]}", noncontiguous(t)
    value = data.draw(st.sampled_from(NOT_TENSORS), label="not a tensor")
    return f"{name}: replaced by {value!r}", value


def mutate_tensors(
    data: st.DataObject,
    tensors: Mapping[str, Any],
    foreign: Sequence[Mapping[str, torch.Tensor]],
    *,
    max_mutations: int = 3,
) -> tuple[list[str], Tensors]:
    """1 to ``max_mutations`` mutations of a format's stored tensors. ``foreign`` holds
    other formats' (or other shapes') stored tensors to borrow from."""
    out: Tensors = dict(tensors)
    gen = _gen(data)
    done: list[str] = []
    for _ in range(data.draw(st.integers(1, max_mutations), label="mutations")):
        op = data.draw(
            st.sampled_from(("tensor", "tensor", "tensor", "drop", "unknown", "foreign tensor", "foreign set")),
            label="op",
        )
        names = sorted(out)
        if op == "tensor" and names:
            name = data.draw(st.sampled_from(names), label="name")
            desc, out[name] = mutate_tensor(data, name, out[name], gen)
            done.append(desc)
        elif op == "drop" and names:
            name = data.draw(st.sampled_from(names), label="drop")
            del out[name]
            done.append(f"{name}: dropped")
        elif op == "unknown":
            name = data.draw(st.sampled_from(("bogus", "zeros", "g_idx", "qzeros", "bias", "residual_indices", "codebook")), label="unknown")
            other = [f[name] for f in foreign if name in f]
            out[name] = other[0] if other else torch.zeros(8)
            done.append(f"{name}: added ({describe(out[name])})")
        elif op == "foreign tensor" and foreign and names:
            donor = data.draw(st.sampled_from(range(len(foreign))), label="donor")
            name = data.draw(st.sampled_from(names), label="replaced")
            pool = foreign[donor]
            src = name if name in pool else sorted(pool)[0]
            out[name] = pool[src]
            done.append(f"{name}: replaced by another format's {src} ({describe(pool[src])})")
        elif op == "foreign set" and foreign:
            donor = data.draw(st.sampled_from(range(len(foreign))), label="donor set")
            out = dict(foreign[donor])
            done.append(f"all tensors replaced by another format's {sorted(out)}")
    return done, out


# --- activations ----------------------------------------------------------------------------------


def mutate_activation(data: st.DataObject, name: str, x: torch.Tensor) -> tuple[str, Any]:
    """A mutation of an activation ``[..., K]``: wrong dtype, shape, layout, device, values."""
    gen = _gen(data)
    family = data.draw(
        st.sampled_from(("dtype", "shape", "layout", "values", "device", "not a tensor", "grad", "batch", "empty rows")),
        label="x family",
    )
    if family == "dtype":
        dtype = data.draw(st.sampled_from([d for d in ALL_DTYPES if d != x.dtype]), label="x dtype")
        new = retype(x, dtype)
        return f"{name}: dtype {x.dtype} -> {dtype}", new if new is not None else torch.zeros(x.shape, dtype=dtype)
    if family == "shape":
        kind = data.draw(st.sampled_from(("K+1", "K-1", "K=0", "1-D", "0-D", "transposed")), label="x shape")
        k = x.shape[-1]
        if kind == "K+1":
            new = torch.cat([x, x[..., :1]], dim=-1)
        elif kind == "K-1":
            new = x[..., : k - 1]
        elif kind == "K=0":
            new = x[..., :0]
        elif kind == "1-D":
            new = x.reshape(-1)[:k].clone()
        elif kind == "0-D":
            new = x.reshape(-1)[0].clone()
        else:
            new = x.mT.contiguous() if x.dim() >= 2 else x
        return f"{name}: shape {kind} {tuple(x.shape)} -> {tuple(new.shape)}", new
    if family == "layout":
        kind = data.draw(st.sampled_from(sorted(LAYOUTS)), label="x layout")
        return f"{name}: {kind}", LAYOUTS[kind](x)
    if family == "values":
        kind = data.draw(st.sampled_from(value_mutations(x)), label="x values")
        return f"{name}: values {kind}", mutate_values(x, kind, gen)
    if family == "device":
        return f"{name}: moved to {OTHER_DEVICE}", x.to(OTHER_DEVICE)
    if family == "grad":
        return f"{name}: requires_grad", x.detach().clone().requires_grad_(True)
    if family == "batch":
        lead = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=2), label="batch")
        rows = max(1, x.numel() // x.shape[-1])
        flat = x.reshape(rows, x.shape[-1])
        count = 1
        for v in lead:
            count *= v
        new = flat[torch.arange(count) % rows].reshape(*lead, x.shape[-1]) if count else flat[:0].reshape(*lead, x.shape[-1])
        return f"{name}: batch shape {tuple(new.shape)}", new
    if family == "empty rows":
        return f"{name}: no rows", x.reshape(-1, x.shape[-1])[:0]
    value = data.draw(st.sampled_from(NOT_TENSORS), label="x not a tensor")
    return f"{name}: replaced by {value!r}", value


def describe(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} on {t.device}"
    return type(t).__name__


# --- another parameterisation of the same format -------------------------------------------------


def reparameterize(data: st.DataObject, fmt: Any) -> tuple[str, Any]:
    """The format with one parameter changed (another group size, bit width, ...), for
    tensors written under the original: group sizes that do not divide, codes read at
    the wrong width. Returns the original when the change is refused at construction."""
    import dataclasses

    from quantcore.errors import QuantCoreError

    fields = [f for f in dataclasses.fields(fmt) if f.init]
    if not fields:
        return "", fmt
    f = data.draw(st.sampled_from(fields), label="reparam field")
    current = getattr(fmt, f.name)
    if isinstance(current, bool):
        value: Any = not current
    elif isinstance(current, int):
        value = data.draw(st.sampled_from((-1, 0, 1, 2, 3, 4, 8, 16, 24, 32, 48, 64, 96, 100, 128, 256, 512)), label="reparam int")
    elif isinstance(current, torch.dtype):
        value = data.draw(st.sampled_from((torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                                           torch.bfloat16, torch.float32)), label="reparam dtype")
    else:
        return "", fmt
    try:
        return f"format {f.name}={value!r} (tensors written for {current!r})", dataclasses.replace(fmt, **{f.name: value})
    except QuantCoreError:
        return "", fmt
