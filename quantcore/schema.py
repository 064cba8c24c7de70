"""A kernel's prepared-state schema: what ``prepare`` makes for a weight of given dims,
as a pattern a prepared state handed back (a state dict, a custom op's arguments) is
checked against before any op reads it.

A schema is the prepared object itself, written with patterns where its tensors (and
whatever varies between weights of one shape) would be::

    Fields(Int4PackCPU,
           weight=TensorSpec((N, K // 2), (torch.uint8,)),
           bias=Maybe(TensorSpec((N,), FLOAT_DTYPES)),
           group_size=OneOf(32, 64, 128, 256), ...)

The patterns:

``TensorSpec(shape, dtypes)``  a tensor of exactly this shape, in one of ``dtypes``;
``Maybe(p)``                   ``None`` or what ``p`` matches;
``OneOf(p, q, ...)``           what one of them matches (a choice prepare makes from the
                               weight's values, with what depends on it);
``DictOf(keys, value)``        a dict whose keys are some of ``keys``; ``value(key)`` is
                               the pattern of each value (a per-dtype cache);
``Fields(cls, **fields)``      an instance of exactly ``cls`` whose every dataclass field
                               matches (every field must be given);
``Depends(cls, build)``        an instance of exactly ``cls`` matching ``build(value)``: the
                               pattern read off the value's own plain fields (a sub-group
                               size prepare chose, that other shapes follow);
``Satisfies(test, what)``      a value for which ``test`` holds (``what`` says which);
``ANY``                        anything (use sparingly: nothing checks it);

and plain values, tuples, lists and dicts, which match themselves element by element.

:func:`mismatch` answers where a value departs from its schema, naming the path of the
field (``scales_offsets``, ``passes[1].indices``) and what was expected and what came.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ANY", "Depends", "DictOf", "Fields", "Maybe", "OneOf", "Satisfies", "TensorSpec", "describe_tensor", "mismatch"]


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]
    #: For an index tensor: every element in ``[low, high)`` (an op would read past a table).
    bounds: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtypes", tuple(self.dtypes))

    def describe(self) -> str:
        names = "/".join(str(d).removeprefix("torch.") for d in self.dtypes)
        return f"{names} {list(self.shape)}"

    def out_of_bounds(self, t: torch.Tensor) -> str | None:
        if self.bounds is None or t.numel() == 0 or t.device.type == "meta":
            return None
        low, high = int(t.min()), int(t.max())
        if low < self.bounds[0] or high >= self.bounds[1]:
            return f"values in [{low}, {high}], expected them in [{self.bounds[0]}, {self.bounds[1]})"
        return None


@dataclass(frozen=True)
class Maybe:
    pattern: Any


class OneOf:
    def __init__(self, *options: Any) -> None:
        self.options = options

    def __repr__(self) -> str:
        return f"OneOf{self.options!r}"


@dataclass(frozen=True)
class DictOf:
    keys: tuple[Any, ...]
    value: Callable[[Any], Any]


class Fields:
    def __init__(self, cls: type, **fields: Any) -> None:
        declared = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        if set(fields) != declared:
            raise TypeError(f"Fields({cls.__name__}): give every field {sorted(declared)}, got {sorted(fields)}")
        self.cls, self.fields = cls, fields

    def __repr__(self) -> str:
        return f"Fields({self.cls.__name__}, {self.fields!r})"


@dataclass(frozen=True)
class Depends:
    cls: type
    build: Callable[[Any], Any]


@dataclass(frozen=True)
class Satisfies:
    test: Callable[[Any], bool]
    what: str


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()


def describe_tensor(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def mismatch(pattern: Any, value: Any, path: str = "", *, name: Callable[[torch.Tensor], str] | None = None) -> str | None:
    """None when ``value`` matches ``pattern``; else the first departure, as
    ``"<path>: expected ..., got ..."``. ``name(tensor)`` may name a tensor better than its
    path does (the buffer it was loaded from)."""
    where = path or "prepared"
    if pattern is ANY:
        return None
    if isinstance(pattern, TensorSpec):
        if not isinstance(value, torch.Tensor):
            return f"{where}: expected a {pattern.describe()} tensor, got {_kind(value)}"
        if tuple(value.shape) != pattern.shape or value.dtype not in pattern.dtypes:
            label = name(value) if name is not None else where
            return f"{label}: expected {pattern.describe()}, got {describe_tensor(value)}"
        outside = pattern.out_of_bounds(value)
        if outside:
            return f"{name(value) if name is not None else where}: {outside}"
        return None
    if isinstance(pattern, Maybe):
        return None if value is None else mismatch(pattern.pattern, value, path, name=name)
    if isinstance(pattern, OneOf):
        if not pattern.options:
            return f"{where}: nothing matches (the kernel prepares no such weight)"
        problems = [mismatch(option, value, path, name=name) for option in pattern.options]
        if not all(problems):
            return None
        # The option that got furthest explains best: the one whose departure is deepest.
        return max(problems, key=lambda p: (p or "").count(".") + (p or "").count("["))
    if isinstance(pattern, DictOf):
        if not isinstance(value, Mapping):
            return f"{where}: expected a dict, got {_kind(value)}"
        for key, item in value.items():
            if not _in(key, pattern.keys):
                return f"{where}: unexpected key {key!r}; expected some of {list(pattern.keys)}"
            found = mismatch(pattern.value(key), item, f"{where}[{_key(key)}]", name=name)
            if found:
                return found
        return None
    if isinstance(pattern, Satisfies):
        try:
            ok = bool(pattern.test(value))
        except Exception:  # a test on a value of the wrong type
            ok = False
        return None if ok else f"{where}: expected {pattern.what}, got {_kind(value)}"
    if isinstance(pattern, Depends):
        if type(value) is not pattern.cls:
            return f"{where}: expected a {pattern.cls.__name__}, got {_kind(value)}"
        try:
            built = pattern.build(value)
        except Exception as exc:  # plain fields of the wrong type or range
            return f"{where}: its fields do not describe a {pattern.cls.__name__} ({type(exc).__name__}: {exc})"
        return mismatch(built, value, path, name=name)
    if isinstance(pattern, Fields):
        if type(value) is not pattern.cls:
            return f"{where}: expected a {pattern.cls.__name__}, got {_kind(value)}"
        for field, sub in pattern.fields.items():
            found = mismatch(sub, getattr(value, field, None), f"{path}.{field}" if path else field, name=name)
            if found:
                return found
        return None
    if isinstance(pattern, (tuple, list)):
        if type(value) is not type(pattern) or len(value) != len(pattern):
            return f"{where}: expected a {type(pattern).__name__} of {len(pattern)}, got {_kind(value)}"
        for i, (sub, item) in enumerate(zip(pattern, value, strict=True)):
            found = mismatch(sub, item, f"{where}[{i}]", name=name)
            if found:
                return found
        return None
    if isinstance(pattern, Mapping):
        if not isinstance(value, Mapping) or set(map(_hashable, value)) != set(map(_hashable, pattern)):
            keys = sorted(map(repr, pattern))
            return f"{where}: expected a dict with keys {keys}, got {_kind(value)}"
        for key, sub in pattern.items():
            found = mismatch(sub, value[key], f"{where}[{_key(key)}]", name=name)
            if found:
                return found
        return None
    same = type(value) is type(pattern) and value == pattern
    return None if same else f"{where}: expected {pattern!r}, got {value!r}"


def _in(key: Any, keys: Iterable[Any]) -> bool:
    return any(type(key) is type(k) and key == k for k in keys)


def _hashable(key: Any) -> Any:
    return (type(key), key)


def _key(key: Any) -> str:
    return str(key).removeprefix("torch.") if isinstance(key, torch.dtype) else repr(key)


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {describe_tensor(value)} tensor"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (tuple, list, dict)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"
