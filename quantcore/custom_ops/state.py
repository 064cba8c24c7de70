"""A kernel's prepared state as a list of tensors plus a static description of the rest.

``prepare`` returns whatever object a kernel likes; to hand it to a ``torch.library``
op (whose arguments are tensors and plain values), to register its tensors as a
module's buffers, and to rebuild it after they moved, it is split in two:

* the **tensors**, in a fixed order, each object once (a tensor reached twice becomes one
  entry, referenced twice);
* the **tree**: a JSON-able description of everything else, with each tensor replaced by
  its index.

What flattens without any code in the kernel: tensors; ``None``, bools, ints, floats and
strings; ``torch.dtype``; tuples, lists and named tuples; dicts whose keys are plain
values or dtypes (a per-dtype cache); and dataclass instances made of those, Formats
included (a Format is a frozen dataclass of its parameters). A prepared class that is
none of these implements the protocol: ``obj.__quantcore_flatten__()`` returns something
that flattens (a dict of tensors and plain values, say), and the classmethod
``cls.__quantcore_unflatten__(value)`` builds the object back from it.

Rebuilding restores dataclass fields as they were (``__init__`` and ``__post_init__`` are
not re-run: the values already passed them once), so a frozen dataclass, a derived field
or a cache filled at prepare time comes back as it was flattened.

Classes are named ``module:qualname`` in the tree. :func:`unflatten` imports a module
only inside the packages ``allowed`` names (the kernel's own and quantcore), so a tree
read back from a file cannot make it import anything else.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..errors import PluginError, QuantCoreError, TensorFormatError

__all__ = ["FlattenedState", "builder", "class_path", "flatten", "resolve_class", "tensor_count", "unflatten"]

#: What a tree node may be: JSON values, with tensors as {"T": index}.
Tree = Any

_PLAIN = (bool, int, float, str, type(None))
#: Classes met while flattening, by path: unflatten finds them without importing anything.
_SEEN: dict[str, type] = {}


@dataclasses.dataclass(frozen=True)
class FlattenedState:
    tensors: tuple[torch.Tensor, ...]
    #: The tree, encoded (stable: keys sorted), so it can be a hashable op argument.
    tree: str
    #: A readable name per tensor (its path in the object: ``passes_1_indices``).
    names: tuple[str, ...]


def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def flatten(obj: Any, *, where: str = "prepared") -> FlattenedState:
    """Split ``obj`` into tensors and a tree; raises :class:`PluginError` naming the field
    that cannot be flattened."""
    tensors: list[torch.Tensor] = []
    names: list[str] = []
    index: dict[int, int] = {}

    def walk(value: Any, path: tuple[str, ...]) -> Tree:
        if isinstance(value, torch.Tensor):
            if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
                raise PluginError(f"{_dotted(where, path)}: a {type(value).__name__} tensor subclass cannot be "
                                  "a kernel's prepared state; store plain tensors")
            i = index.get(id(value))
            if i is None:
                i = index[id(value)] = len(tensors)
                tensors.append(value.data if isinstance(value, torch.nn.Parameter) else value)
                names.append("_".join(path) or "tensor")
            return {"T": i}
        if isinstance(value, float):
            return {"f": repr(value)}  # JSON has no inf/nan; repr round-trips every float
        if isinstance(value, _PLAIN):
            return value
        if isinstance(value, torch.dtype):
            return {"dtype": str(value).removeprefix("torch.")}
        flatten_hook = getattr(type(value), "__quantcore_flatten__", None)
        if flatten_hook is not None:
            _SEEN[class_path(type(value))] = type(value)
            return {"obj": class_path(type(value)), "v": walk(flatten_hook(value), path)}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _SEEN[class_path(type(value))] = type(value)
            fields = {f.name: walk(getattr(value, f.name), (*path, f.name)) for f in dataclasses.fields(value)}
            return {"dc": class_path(type(value)), "f": fields}
        if isinstance(value, tuple) and hasattr(type(value), "_fields"):
            _SEEN[class_path(type(value))] = type(value)
            return {"nt": class_path(type(value)),
                    "f": [walk(v, (*path, f)) for f, v in zip(value._fields, value, strict=True)]}  # type: ignore[attr-defined]
        if isinstance(value, (tuple, list)):
            items = [walk(v, (*path, str(i))) for i, v in enumerate(value)]
            return {"t": items} if isinstance(value, tuple) else {"l": items}
        if isinstance(value, dict):
            pairs = []
            for k, v in value.items():
                key = walk(k, path)
                if isinstance(key, dict) and "T" in key:
                    raise PluginError(f"{_dotted(where, path)}: a dict keyed by tensors cannot be flattened")
                pairs.append([key, walk(v, (*path, _key_name(k)))])
            return {"D": pairs}
        raise PluginError(
            f"{_dotted(where, path)}: a {type(value).__module__}.{type(value).__qualname__} cannot be flattened "
            "into op arguments; make the prepared state a dataclass of tensors and plain values, or give "
            "its class __quantcore_flatten__ / __quantcore_unflatten__"
        )

    tree = walk(obj, ())
    return FlattenedState(tuple(tensors), json.dumps(tree, sort_keys=True, separators=(",", ":")),
                          _unique(names))


def unflatten(
    tree: str | Tree, tensors: Iterable[torch.Tensor], *, allowed: Iterable[str] = ("quantcore",),
    where: str = "prepared-state tree",
) -> Any:
    """The object :func:`flatten` described, with ``tensors`` in place of its own. A tree
    is data (it may come from a file): one that :func:`flatten` cannot have written is a
    :class:`~quantcore.errors.TensorFormatError` naming ``where``."""
    return builder(tree, allowed=allowed, where=where)(list(tensors))


def builder(
    tree: str | Tree, *, allowed: Iterable[str] = ("quantcore",), where: str = "prepared-state tree",
) -> Callable[[Sequence[torch.Tensor]], Any]:
    """:func:`unflatten` in two steps: the tree read and checked once (its classes
    resolved), and a function that builds the object on a list of tensors — what a call
    through a custom op repeats, so it does only the building. A tensor index past the
    list's end is a :class:`~quantcore.errors.TensorFormatError` at build time."""
    try:
        node = json.loads(tree) if isinstance(tree, str) else tree
    except ValueError as exc:
        raise TensorFormatError(f"{where}: not a prepared-state tree ({exc})") from None
    allow = tuple(allowed)

    def bad(n: Any, why: str) -> TensorFormatError:
        return TensorFormatError(f"{where}: {why}: {json.dumps(n, default=repr)[:80]}")

    def const(value: Any) -> Callable[[Sequence[torch.Tensor]], Any]:
        return lambda ts: value

    def compile_node(n: Tree) -> Callable[[Sequence[torch.Tensor]], Any]:
        if isinstance(n, list):
            raise bad(n, "a bare list is not a node")
        if not isinstance(n, dict):
            return const(n)
        if "T" in n:
            i = n["T"]
            if type(i) is not int or i < 0:
                raise bad(n, "tensor index out of range")

            def tensor(ts: Sequence[torch.Tensor], i: int = i, n: Tree = n) -> torch.Tensor:
                if i >= len(ts):
                    raise bad(n, f"tensor index out of range (0..{len(ts) - 1})")
                return ts[i]
            return tensor
        if "f" in n and len(n) == 1:
            try:
                return const(float(n["f"]))
            except (TypeError, ValueError):
                raise bad(n, "not a float") from None
        if "dtype" in n:
            if not isinstance(n["dtype"], str):
                raise bad(n, "not a dtype name")
            return const(_dtype(n["dtype"], where))
        for key in ("t", "l"):
            if key in n:
                items = n[key]
                if not isinstance(items, list):
                    raise bad(n, "expected a list of items")
                parts = [compile_node(v) for v in items]
                if key == "t":
                    return lambda ts: tuple(f(ts) for f in parts)
                return lambda ts: [f(ts) for f in parts]
        if "D" in n:
            pairs = n["D"]
            if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise bad(n, "expected a list of [key, value] pairs")
            entries = []
            for k, v in pairs:
                key_node = compile_node(k)
                if isinstance(k, dict) and "T" in k:
                    raise bad(n, "a dict keyed by tensors")
                dict_key = _hashable(key_node(()))
                try:
                    hash(dict_key)
                except TypeError:
                    raise bad(n, "a dict key that cannot be hashed") from None
                entries.append((dict_key, compile_node(v)))
            return lambda ts: {k: f(ts) for k, f in entries}
        if "obj" in n:
            cls = _resolve(n["obj"], allow, where)
            hook = getattr(cls, "__quantcore_unflatten__", None)
            if hook is None:
                raise bad(n, f"{n['obj']} has no __quantcore_unflatten__")
            value = compile_node(n.get("v"))

            def obj(ts: Sequence[torch.Tensor], hook: Any = hook, value: Any = value, n: Tree = n) -> Any:
                try:
                    return hook(value(ts))
                except QuantCoreError:
                    raise
                except Exception as exc:  # the class's own code, on data from a file
                    raise bad(n, f"{n['obj']}.__quantcore_unflatten__ raised {type(exc).__name__}: {exc}") from None
            return obj
        if "nt" in n:
            cls = _resolve(n["nt"], allow, where)
            items = n.get("f")
            fields = getattr(cls, "_fields", None)
            if not (issubclass(cls, tuple) and isinstance(fields, tuple)) or not isinstance(items, list) \
                    or len(items) != len(fields):
                raise bad(n, f"not a named tuple of {n['nt']}")
            parts = [compile_node(v) for v in items]
            return lambda ts: cls(*(f(ts) for f in parts))
        if "dc" in n:
            cls = _resolve(n["dc"], allow, where)
            fields = n.get("f")
            if not dataclasses.is_dataclass(cls) or not isinstance(fields, dict) \
                    or set(fields) != {f.name for f in dataclasses.fields(cls)}:
                raise bad(n, f"not the fields of dataclass {n['dc']}")
            named = [(name, compile_node(v)) for name, v in fields.items()]

            def dc(ts: Sequence[torch.Tensor], cls: type = cls) -> Any:
                obj: Any = object.__new__(cls)
                for name, f in named:
                    object.__setattr__(obj, name, f(ts))
                return obj
            return dc
        raise bad(n, "unknown node")

    return compile_node(node)


def tensor_count(tree: str | Tree) -> int:
    """How many tensors a tree refers to (one more than its largest index)."""
    try:
        node = json.loads(tree) if isinstance(tree, str) else tree
    except ValueError:
        return -1
    top = -1
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            if type(n.get("T")) is int:
                top = max(top, n["T"])
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)
    return top + 1


def _resolve(path: Any, allowed: tuple[str, ...], where: str) -> type:
    if not isinstance(path, str):
        raise TensorFormatError(f"{where}: a class path must be a string, got {path!r:.80}")
    try:
        return resolve_class(path, allowed)
    except PluginError as exc:
        raise TensorFormatError(f"{where}: {exc}") from None


def resolve_class(path: str, allowed: tuple[str, ...] = ("quantcore",)) -> type:
    """The class at ``module:qualname``: one met while flattening, or one imported from a
    module inside the ``allowed`` top-level packages."""
    seen = _SEEN.get(path)
    if seen is not None:
        return seen
    module, _, qualname = path.partition(":")
    if module.split(".")[0] not in allowed:
        raise PluginError(f"prepared-state class {path}: expected one of the packages {list(allowed)}")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"prepared-state class {path}: cannot be found ({exc})") from None
    if not isinstance(obj, type):
        raise PluginError(f"prepared-state class {path}: not a class")
    _SEEN[path] = obj
    return obj


def _dtype(name: str, where: str = "prepared-state tree") -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TensorFormatError(f"{where}: unknown dtype {name!r}")
    return dtype


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _key_name(key: Any) -> str:
    if isinstance(key, torch.dtype):
        return str(key).removeprefix("torch.")
    if isinstance(key, tuple):
        return "_".join(_key_name(k) for k in key)
    return str(key)


def _dotted(where: str, path: tuple[str, ...]) -> str:
    return ".".join((where, *path))


def _unique(names: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    taken: set[str] = set()
    for name in names:
        clean = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
        candidate, n = clean, 1
        while candidate in taken:
            n += 1
            candidate = f"{clean}_{n}"
        taken.add(candidate)
        out.append(candidate)
    return tuple(out)
