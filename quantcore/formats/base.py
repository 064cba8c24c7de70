"""The Format interface: a named, versioned storage format with its golden math.

A format instance is a frozen dataclass of its parameters (bits, group_size, ...), in
the manner of torchao's layouts: hashable, comparable, cheap to pass around. Its golden
``quantize`` / ``dequantize`` are plain float torch written from the format's spec and
are what every kernel is checked against; they favour clarity over speed.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from ..errors import FusionError, QuantCoreError, ShardError, TensorFormatError

if typing.TYPE_CHECKING:
    from .sharding import Shard

__all__ = ["Format", "coerce_params"]

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class Format(ABC):
    """Base class of every storage format. Subclasses are ``@dataclass(frozen=True)``.

    Two checks run before a subclass's own code, so every format has them:

    * parameters are type-checked before its ``__post_init__``: a field annotated
      ``bool``, ``int``, ``str`` or ``torch.dtype`` refuses a value of another type with
      a :class:`~quantcore.errors.TensorFormatError` naming it (the string ``"false"``
      is truthy, so a bool field must not take it). ``from_params`` is the loose door,
      for CLI strings and config files;
    * ``validate`` first checks what any set of stored tensors must be
      (:func:`quantcore.tensors.check_stored`): a mapping of names to tensors that hold
      data (not ``meta``), all on one device.
    """

    #: Registry name, e.g. ``"gptq"``; what ``get_kernel("gptq", ...)`` looks up.
    name: ClassVar[str]
    #: Bumped when the meaning of stored tensors changes.
    version: ClassVar[int] = 1
    #: The op the format's tensors feed (see ``quantcore.ops``).
    op: ClassVar[str] = "linear"

    @property
    @abstractmethod
    def slug(self) -> str:
        """Short id of this parameterisation for tables and test ids: ``gptq4-g128-asym``."""

    @abstractmethod
    def validate(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """Check a set of stored tensors against this format; return the problem dims
        they imply (for a linear: ``{"K": in_features, "N": out_features}``). Raises
        :class:`~quantcore.errors.TensorFormatError` naming the tensor at fault."""

    @abstractmethod
    def quantize(
        self, weight: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """Golden quantizer from a dense float weight to this format's stored tensors."""

    @abstractmethod
    def dequantize(
        self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """Golden dequantizer back to a dense weight in the op's natural layout."""

    #: The dims :meth:`shard` can cut this format's layers along (``"K"``, ``"N"``, ``"E"``).
    shard_dims: ClassVar[tuple[str, ...]] = ()
    #: Whether ``shard(..., dim="N", index=...)`` takes an explicit list of outputs.
    shard_by_index: ClassVar[bool] = False

    def shard_rules(self, dim: str) -> tuple[str, ...]:
        """Named cuts along ``dim`` a caller may ask for (``rule=``); the first is the one
        taken when none is named."""
        return ()

    def shard(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        dim: str,
        rank: int,
        world: int,
        rule: str | None = None,
        index: torch.Tensor | None = None,
    ) -> Shard:
        """Rank ``rank``'s tensor-parallel shard of a layer's stored tensors, cut along
        ``dim`` into ``world`` equal parts (see :mod:`quantcore.formats.sharding`): the
        request is checked here, then the format's ``shard_tensors`` cuts. ``rule`` names
        an alternative cut (:meth:`shard_rules`); ``index`` gives a column-parallel shard
        an explicit, ordered list of outputs (where :attr:`shard_by_index`)."""
        from .sharding import check_request

        if not self.shard_dims:
            raise ShardError(f"{self.slug}: the {self.name} format defines no tensor-parallel shard")
        check_request(self.slug, dim, rank, world, self.shard_dims)
        extra: dict[str, Any] = {}
        if rule is not None:
            rules = self.shard_rules(dim)
            if rule not in rules:
                raise ShardError(f"{self.slug} shard: rule: expected one of {list(rules)} for dim={dim}, got {rule!r}")
            extra["rule"] = rule
        if index is not None:
            if dim != "N" or not self.shard_by_index:
                raise ShardError(f"{self.slug} shard: index: only a column (N) cut of a format with "
                                 f"shard_by_index takes one; {self.name} along {dim} does not")
            extra["index"] = index
        return self.shard_tensors(tensors, dim=dim, rank=rank, world=world, **extra)

    def shard_tensors(
        self, tensors: Mapping[str, torch.Tensor], *, dim: str, rank: int, world: int, **extra: Any
    ) -> Shard:
        """The format's own cut, for a request :meth:`shard` has checked."""
        raise ShardError(f"{self.slug}: the {self.name} format defines no tensor-parallel shard")

    #: Whether :meth:`concat` can lay this format's layers end to end along N.
    concatenates: ClassVar[bool] = False

    def concat(
        self, parts: typing.Sequence[Mapping[str, torch.Tensor]], *, names: typing.Sequence[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """Layers that read the same input, laid end to end along N, as one layer's stored
        tensors, bit for bit: the inverse of a column cut (``shard(..., dim="N")`` gives
        equal parts back). The parts must share K and everything not cut along N (bits,
        group size, ``g_idx``, rotations …); a :class:`~quantcore.errors.FusionError`
        names the parts (``names``) and what differs."""
        if not self.concatenates:
            raise FusionError(f"{self.slug}: the {self.name} format defines no concatenation along N")
        return self.concat_tensors(parts, names=names)

    def concat_tensors(
        self, parts: typing.Sequence[Mapping[str, torch.Tensor]], *, names: typing.Sequence[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """The format's own concatenation, for :meth:`concat`."""
        raise FusionError(f"{self.slug}: the {self.name} format defines no concatenation along N")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is not None and not getattr(own, "_quantcore_checked", False):

            @functools.wraps(own)
            def __post_init__(self: Format) -> None:
                check_param_types(self)
                own(self)

            __post_init__._quantcore_checked = True  # type: ignore[attr-defined]
            cls.__post_init__ = __post_init__  # type: ignore[method-assign]
        validate = cls.__dict__.get("validate")
        if validate is not None and not getattr(validate, "_quantcore_checked", False):

            @functools.wraps(validate)
            def checked_validate(self: Format, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
                from ..tensors import check_stored

                check_stored(tensors, where=f"{self.slug} tensors")
                return validate(self, tensors)  # type: ignore[no-any-return]

            checked_validate._quantcore_checked = True  # type: ignore[attr-defined]
            cls.validate = checked_validate  # type: ignore[method-assign]

    def __post_init__(self) -> None:
        check_param_types(self)

    def params(self) -> dict[str, Any]:
        """This instance's parameters as plain data (for JSON and explain tables)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            out[f.name] = str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v
        return out

    @classmethod
    def from_params(cls, **params: Any) -> Format:
        """Build an instance from loose parameters (CLI strings, config files): strings
        become the field's type (``"4"``, ``"true"``, ``"int32"``, ``"fp16"``); unknown
        names and unreadable strings are refused naming the parameter."""
        return cls(**coerce_params(cls, params))


def _kind(hint: Any) -> str | None:
    if hint in (bool, int, str, torch.dtype):
        return hint.__name__ if hint is not torch.dtype else "dtype"
    return None


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name) for f in dataclasses.fields(cls) if f.init}


def check_param_types(fmt: Format) -> None:
    """Refuse a parameter whose value is not of its field's declared type; an int-like
    (``numpy.int64``) is stored as a plain int."""
    for name, hint in _field_hints(type(fmt)).items():
        value = getattr(fmt, name)
        kind = _kind(hint)
        if kind is None:
            continue
        if kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "int":
            ok = not isinstance(value, bool) and hasattr(value, "__index__")
            if ok and type(value) is not int:
                object.__setattr__(fmt, name, int(value.__index__()))
        elif kind == "str":
            ok = isinstance(value, str)
        else:
            ok = isinstance(value, torch.dtype)
        if not ok:
            raise TensorFormatError(
                f"{fmt.name} {name}: expected a {kind}, got {value!r} ({type(value).__name__})"
            )


def _parse_dtype(text: str) -> torch.dtype | None:
    from ..dtypes import parse_dtype

    try:
        return parse_dtype(text)
    except QuantCoreError:
        found = getattr(torch, text.strip().removeprefix("torch."), None)
        return found if isinstance(found, torch.dtype) else None


def coerce_params(cls: type[Format], params: Mapping[str, Any]) -> dict[str, Any]:
    """Loose parameters → the field types of ``cls`` (what ``from_params`` does)."""
    hints = _field_hints(cls)
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name not in hints:
            raise TensorFormatError(
                f"{cls.name} {name}: not a parameter of {cls.name}; it takes {', '.join(hints)}"
            )
        kind = _kind(hints[name])
        if kind == "bool" and isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
            value = bool(value)
        if isinstance(value, str) and kind not in (None, "str"):
            text = value.strip()
            parsed: Any = None
            if kind == "bool":
                parsed = True if text.lower() in _TRUE else False if text.lower() in _FALSE else None
            elif kind == "int":
                try:
                    parsed = int(text)
                except ValueError:
                    parsed = None
            else:
                parsed = _parse_dtype(text)
            if parsed is None:
                raise TensorFormatError(f"{cls.name} {name}: expected a {kind}, got {value!r}")
            value = parsed
        out[name] = value
    return out
