"""Fused projections: linears that read the same input — q/k/v, gate/up — run as one
quantized linear along N.

A decode step of a Llama-shaped model runs seven linears per layer. Five of them read one
of two inputs (the attention's q, k, v; the MLP's gate and up), and the small ones
(4096 → 1024) sit far from the bandwidth a GEMV can reach; fused, they are two launches
of 6144 and 28672 outputs instead of five.

**Exact.** The fused layer's stored tensors are the parts' laid end to end along N by the
format's :meth:`~quantcore.formats.base.Format.concat`, bit for bit; it refuses parts that
differ in anything but their outputs (K, bits, group size, ``g_idx``, rotations). The
kernel is chosen for the fused shape; where it computes each output column on its own,
the fused outputs equal the parts' bit for bit.

**The model's code does not change.** The fused module takes a name beside the parts
(the stems joined: ``qkv_proj``, ``gate_up_proj``, ``query_key_value``) and each part's
name holds a :class:`FusedSlice`. Called with an input, a slice runs the fused layer once
and every part gets its slice of that one output (views of one ``split``), so
``q_proj(x)``, ``k_proj(x)``, ``v_proj(x)`` cost one GEMM. The output is matched to the
input by identity (and, in eager calls, by the tensor's version counter, so an in-place
change in between is seen): a part called with another tensor runs the fused layer
again — still correct, only slower. Traced by ``torch.compile(fullgraph=True)`` or
``torch.export``, the same code becomes one quantcore op and one split.

**State dicts.** The fused model's state dict is the fused layer's prepared state under
the fused name. A checkpoint's tensors under the parts' own names (``…q_proj.qweight`` …)
load into it as well: each slice takes its part's tensors and the fused layer
concatenates and prepares them once every part has arrived.

**Three ways in.** ``quantize_(model, fmt, fuse=True)`` and ``load_quantized(...,
fuse=True)`` fuse while quantizing or reading: the parts' tensors are concatenated
before anything is prepared. :func:`fuse_projections` fuses a model already quantized,
whose layers still hold their format's tensors (``keep_source=True``, or TurboQuant's
float32 prepared passes). Groups that cannot be fused are refused with the layers named
and what differs; a model without fusable groups is left as it was.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import (
    FusionError,
    InvalidArgumentError,
    QuantCoreError,
    QuantCoreWarning,
    TensorFormatError,
)
from ..formats.base import Format
from ..formats.sharding import format_difference
from ..formats.turboquant import TurboQuant
from ..tensors import version_of
from .linear import QuantLinear
from .quant_module import SOURCE, QuantModule
from .turboquant.module import TurboQuantLinear

__all__ = [
    "DEFAULT_GROUPS",
    "FusedSlice",
    "FusionGroup",
    "build_fused",
    "find_groups",
    "fuse_projections",
    "fused_module",
    "install",
    "quantize_fused",
    "refusal_warning",
]

#: Sibling linears that read the same input, in the order their outputs are laid out:
#: the Llama family's attention and MLP, the BERT family's attention.
DEFAULT_GROUPS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("query", "key", "value"),
)


@dataclass(frozen=True)
class FusionGroup:
    """Sibling linears ``leaves`` of the module ``parent`` (``""``: the root), fused in
    that order."""

    parent: str
    leaves: tuple[str, ...]

    @property
    def fused_leaf(self) -> str:
        """The fused module's name beside the parts: the stems joined before a shared
        ``_suffix`` (``q_proj, k_proj, v_proj`` → ``qkv_proj``, ``gate_proj, up_proj`` →
        ``gate_up_proj``, ``query, key, value`` → ``query_key_value``)."""
        suffix = ""
        tail = self.leaves[0].rpartition("_")[2]
        if "_" in self.leaves[0] and all(leaf.endswith("_" + tail) and leaf != "_" + tail for leaf in self.leaves):
            suffix = "_" + tail
        stems = [leaf[: len(leaf) - len(suffix)] for leaf in self.leaves]
        return ("" if all(len(s) == 1 for s in stems) else "_").join(stems) + suffix

    def qualified(self, leaf: str) -> str:
        return f"{self.parent}.{leaf}" if self.parent else leaf

    @property
    def names(self) -> tuple[str, ...]:
        """The parts' module names in the model."""
        return tuple(self.qualified(leaf) for leaf in self.leaves)

    @property
    def fused_name(self) -> str:
        return self.qualified(self.fused_leaf)

    def describe(self) -> str:
        return f"{self.parent or '(root)'}: {', '.join(self.leaves)}"


def _check_specs(groups: Sequence[Sequence[str]]) -> tuple[tuple[str, ...], ...]:
    specs = tuple(tuple(g) for g in groups)
    for spec in specs:
        if len(spec) < 2 or len(set(spec)) != len(spec) or not all(isinstance(s, str) and s for s in spec):
            raise InvalidArgumentError(f"groups: each group is two or more distinct module names, got {spec!r}")
    return specs


def find_groups(
    model: nn.Module, candidates: Iterable[str], groups: Sequence[Sequence[str]] = DEFAULT_GROUPS
) -> tuple[list[FusionGroup], list[tuple[FusionGroup, str]]]:
    """The groups of ``groups`` whose every part is among ``candidates`` (module names in
    ``model``), each module in one group at most (the first that takes it); and the
    groups whose fused name is already taken in their parent, with why they cannot be
    fused."""
    specs = _check_specs(groups)
    names = set(candidates)
    found: list[FusionGroup] = []
    blocked: list[tuple[FusionGroup, str]] = []
    taken: set[str] = set()
    for parent in sorted({n.rpartition(".")[0] for n in names}):
        for spec in specs:
            group = FusionGroup(parent, spec)
            if not all(n in names and n not in taken for n in group.names):
                continue
            owner = model.get_submodule(parent) if parent else model
            if hasattr(owner, group.fused_leaf):
                blocked.append((group, f"{parent or 'the model'} already has an attribute {group.fused_leaf!r}"))
                continue
            taken.update(group.names)
            found.append(group)
    return found, blocked


# --- the fused layer and its slices ----------------------------------------------------------------


class _FusedOutputs:
    """The fused layer, the split of its output for the input it last ran on, and the
    parts' checkpoint tensors while a state dict under their names is being loaded."""

    def __init__(self, fused: QuantModule, group: FusionGroup, sizes: Sequence[int]) -> None:
        self.fused = fused
        self.leaves = group.leaves
        self.fused_leaf = group.fused_leaf
        self.sizes = tuple(sizes)
        self.starts = tuple(sum(self.sizes[:i]) for i in range(len(self.sizes)))
        #: (input, its version, the parts' outputs) of the last fused call, while parts
        #: are still to be served. Replaced whole, never changed in place: a thread that
        #: read it reads one call's outputs, whatever another thread does meanwhile.
        self._split: tuple[torch.Tensor, int, tuple[torch.Tensor, ...]] | None = None
        self._left = 0
        self._arrived: dict[int, dict[str, torch.Tensor]] = {}
        self._prefix = ""
        fused.register_load_state_dict_post_hook(self._after_load)

    # --- calls ------------------------------------------------------------------------------

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        version = version_of(x)
        split = self._split
        if split is None or split[0] is not x or split[1] != version:
            # split_with_sizes itself: Tensor.split is a Python wrapper around it.
            split = (x, version, self.fused(x).split_with_sizes(self.sizes, -1))
            self._split, self._left = split, len(self.sizes)
        self._left -= 1
        if self._left <= 0:  # every part served: hold no tensor between forwards
            self._split, self._left = None, 0
        return split[2][index]

    # --- a checkpoint's tensors under the parts' names ------------------------------------------

    def arrive(self, index: int, tensors: dict[str, torch.Tensor], prefix: str) -> None:
        leaf = self.leaves[index]
        parent = prefix[: len(prefix) - len(leaf) - 1]
        self._prefix = f"{parent}{self.fused_leaf}."
        self._arrived[index] = tensors

    def _after_load(self, module: nn.Module, incompatible: Any) -> None:
        if not self._arrived:
            return
        arrived, self._arrived = self._arrived, {}
        where = self._prefix.rstrip(".")
        absent = [leaf for i, leaf in enumerate(self.leaves) if i not in arrived]
        if absent:
            have = [leaf for i, leaf in enumerate(self.leaves) if i in arrived]
            raise TensorFormatError(f"{where}: the state dict holds the checkpoint's tensors of {', '.join(have)} "
                                    f"but none of {', '.join(absent)}; a fused layer loads all its parts or its own state")
        assert isinstance(module, QuantModule)
        fmt = module.format
        parts = [arrived[i] for i in range(len(self.leaves))]
        for leaf, part, size in zip(self.leaves, parts, self.sizes, strict=True):
            n = fmt.validate(part)["N"]
            if n != size:
                raise TensorFormatError(f"{where}: {leaf}: the state dict's tensors have {n} outputs, "
                                        f"the fused layer holds {size} for it")
        module.load_tensors(fmt.concat(parts, names=self.leaves))  # type: ignore[operator]
        incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if not k.startswith(self._prefix)]


class FusedSlice(nn.Module):
    """Part ``index`` of a fused linear, at the part's own name: its slice of the fused
    layer's output (see the module docstring). It holds no state of its own."""

    def __init__(self, outputs: _FusedOutputs, index: int) -> None:
        super().__init__()
        self._outputs = outputs
        self.index = index

    @property
    def fused(self) -> QuantModule:
        return self._outputs.fused

    @property
    def in_features(self) -> int:
        return self.fused.dims["K"]

    @property
    def out_features(self) -> int:
        return self._outputs.sizes[self.index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._outputs.output(x, self.index)

    def _load_from_state_dict(
        self, state_dict: Mapping[str, Any], prefix: str, local_metadata: Any, strict: bool,
        missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str],
    ) -> None:
        mine = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if not mine:
            return
        if "_extra_state" in mine:
            raise TensorFormatError(
                f"{prefix}_extra_state: the state dict holds this layer's prepared state from an unfused model; "
                f"the fused model loads the checkpoint's tensors under {prefix}… or its own state under "
                f"…{self._outputs.fused_leaf}"
            )
        self._outputs.arrive(self.index, mine, prefix)

    def extra_repr(self) -> str:
        start = self._outputs.starts[self.index]
        return f"{self._outputs.fused_leaf}[..., {start}:{start + self.out_features}]"


# --- building ---------------------------------------------------------------------------------------

#: ``read(group, name)``: the stored tensors of one part, with the format they are in.
Read = Callable[[FusionGroup, str], tuple[Format, Mapping[str, torch.Tensor]]]
#: ``build(group, fmt, tensors)``: the fused module from the concatenated tensors.
Build = Callable[[FusionGroup, Format, dict[str, torch.Tensor]], QuantModule]


def fused_module(
    fmt: Format,
    tensors: Mapping[str, torch.Tensor],
    *,
    device: str | torch.device | None,
    dtype: torch.dtype | None,
    prefer: str | Sequence[str] | None = None,
    keep_source: bool = False,
) -> QuantModule:
    """The module that runs ``fmt``'s linear, as ``quantize_`` builds it: a
    :class:`TurboQuantLinear` for TurboQuant, a :class:`QuantLinear` otherwise."""
    if isinstance(fmt, TurboQuant):
        dims = fmt.validate(tensors)
        module = TurboQuantLinear(dims["K"], dims["N"], fmt, bias="bias" in tensors, device=device, dtype=dtype,
                                  keep_source=keep_source)
        module.load_tensors(tensors, prefer=prefer)
        return module
    return QuantLinear(fmt, tensors, device=device, dtype=dtype or torch.bfloat16, prefer=prefer,
                       keep_source=keep_source)


def build_fused(
    groups: Iterable[FusionGroup], read: Read, build: Build, *, skip_unreadable: bool = False
) -> tuple[dict[str, nn.Module], dict[str, str]]:
    """For each group: read its parts, concatenate them with the format's ``concat``,
    build one module. Returns the modules to set in the model (the fused module at its
    name, a :class:`FusedSlice` at each part's) and, for each group that could not be
    fused, why. With ``skip_unreadable`` a group whose part cannot be read is left out
    without a reason (for callers that go on to read its layers one by one and report
    the error there). The model itself is not touched (see :func:`install`)."""
    modules: dict[str, nn.Module] = {}
    refused: dict[str, str] = {}
    for group in groups:
        try:
            try:
                parts = [read(group, name) for name in group.names]
            except QuantCoreError:
                if skip_unreadable:
                    continue
                raise
            fmt = parts[0][0]
            for leaf, (other, _) in zip(group.leaves[1:], parts[1:], strict=True):
                if other != fmt:
                    raise FusionError(f"{group.leaves[0]} is {fmt.slug}, {leaf} is {other.slug} "
                                      f"({format_difference(fmt, other)})")
            sizes = [fmt.validate(t)["N"] for _, t in parts]
            tensors = fmt.concat([t for _, t in parts], names=group.leaves)
            del parts
            fused = build(group, fmt, tensors)
        except QuantCoreError as exc:
            refused[group.describe()] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            continue
        outputs = _FusedOutputs(fused, group, sizes)
        modules[group.fused_name] = fused
        modules.update({name: FusedSlice(outputs, i) for i, name in enumerate(group.names)})
    return modules, refused


def install(model: nn.Module, modules: Mapping[str, nn.Module]) -> None:
    """Set each module at its name (what :func:`build_fused` returned)."""
    for name, module in modules.items():
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, module)


def refusal_warning(refused: Mapping[str, str], *, where: str, total: int) -> None:
    """One :class:`QuantCoreWarning` listing the groups left unfused and why."""
    if not refused:
        return
    listed = "; ".join(f"{group} ({why})" for group, why in list(refused.items())[:5])
    more = f"; and {len(refused) - 5} more" if len(refused) > 5 else ""
    warnings.warn(f"{where}: {len(refused)} of {total} groups of projections left unfused: {listed}{more}",
                  QuantCoreWarning, stacklevel=3)


# --- dense layers, quantized as one -------------------------------------------------------------------


def quantize_fused(
    model: nn.Module,
    fmt: Format,
    linears: Mapping[str, nn.Linear],
    *,
    dtype_of: Callable[[nn.Linear], torch.dtype],
    generator_of: Callable[[str], torch.Generator],
    prefer: str | Sequence[str] | None = None,
    keep_source: bool = False,
    groups: Sequence[Sequence[str]] = DEFAULT_GROUPS,
) -> tuple[set[str], dict[str, str], int]:
    """``quantize_``'s ``fuse=True``: every group among the dense ``linears`` (name →
    layer) quantized part by part with ``fmt``'s golden quantizer, concatenated, bound
    as one module and installed. The parts of a group share one random draw
    (``generator_of(fused name)`` afresh for each), so TurboQuant's rotations and
    act-order's column order agree and the concatenation is exact. Returns the names of
    the linears fused, the groups refused with why, and how many groups were found."""
    found, blocked = find_groups(model, linears, groups)
    refused = {g.describe(): why for g, why in blocked}
    total = len(found) + len(blocked)
    fused: set[str] = set()
    ok: list[FusionGroup] = []
    for group in found:
        parts = [linears[name] for name in group.names]
        if not fmt.concatenates:
            refused[group.describe()] = f"the {fmt.name} format defines no concatenation along N"
            continue
        head = parts[0]
        why = next((f"{group.leaves[0]} reads {head.in_features} inputs on {head.weight.device} in "
                    f"{dtype_of(head)}, {leaf} {p.in_features} on {p.weight.device} in {dtype_of(p)}"
                    for leaf, p in zip(group.leaves, parts, strict=True)
                    if (p.in_features, p.weight.device, dtype_of(p)) != (head.in_features, head.weight.device,
                                                                         dtype_of(head))), None)
        if why is None:
            ok.append(group)
        else:
            refused[group.describe()] = why

    def read(group: FusionGroup, name: str) -> tuple[Format, Mapping[str, torch.Tensor]]:
        linear = linears[name]
        tensors = dict(fmt.quantize(linear.weight.detach().float(), generator=generator_of(group.fused_name)))
        if linear.bias is not None:
            tensors["bias"] = linear.bias.detach().to(torch.float32)
        return fmt, tensors

    def build(group: FusionGroup, fmt: Format, tensors: dict[str, torch.Tensor]) -> QuantModule:
        head = linears[group.names[0]]
        return fused_module(fmt, tensors, device=head.weight.device, dtype=dtype_of(head), prefer=prefer,
                            keep_source=keep_source)

    built, failed = build_fused(ok, read, build, skip_unreadable=True)
    refused.update(failed)
    install(model, built)
    for group in ok:
        if group.fused_name in built:
            fused.update(group.names)
    return fused, refused, total


# --- a model already quantized -----------------------------------------------------------------------

_LINEAR_MODULES = (QuantLinear, TurboQuantLinear)


def _bound_refusal(group: FusionGroup, modules: Mapping[str, nn.Module]) -> str | None:
    """Why the bound modules of ``group`` cannot be fused, from what they are (their
    tensors are checked when concatenated)."""
    parts = [(leaf, modules[name]) for leaf, name in zip(group.leaves, group.names, strict=True)]
    for leaf, m in parts:
        if not isinstance(m, _LINEAR_MODULES):
            return f"{leaf} is {type(m).__name__}, not a quantized linear"
        if getattr(m, "cpu_offload_pass2", False):
            return f"{leaf} streams its residual pass from host memory (cpu_offload_pass2)"
    head, first = parts[0]
    assert isinstance(first, QuantModule)
    for leaf, m in parts[1:]:
        assert isinstance(m, QuantModule)
        if type(m) is not type(first) or m.format != first.format:
            return (f"{head} is {first.format.slug}, {leaf} is {m.format.slug} "
                    f"({format_difference(first.format, m.format)})")
        if m.dims["K"] != first.dims["K"]:
            return f"in_features differ ({head} {first.dims['K']}, {leaf} {m.dims['K']})"
        if m.dtype != first.dtype:
            return f"activation dtypes differ ({head} {first.dtype}, {leaf} {m.dtype})"
        if _device(m) != _device(first):
            return f"devices differ ({head} on {_device(first)}, {leaf} on {_device(m)})"
    return None


def _device(module: nn.Module) -> torch.device | None:
    tensor = next(iter(module.buffers()), None)
    return tensor.device if tensor is not None else None


def _bound_tensors(module: nn.Module, name: str) -> tuple[Format, dict[str, torch.Tensor]]:
    """The format's tensors a bound module still holds: TurboQuant's prepared passes
    inverted, or the source kept with ``keep_source=True``."""
    assert isinstance(module, QuantModule)
    if isinstance(module, TurboQuantLinear):
        return module.format, module.tensors()
    source = {n[len(SOURCE):]: t for n, t in module.named_buffers(recurse=False) if n.startswith(SOURCE)}
    if not source:
        kernel = module.kernel.name if module.kernel is not None else "its kernel"
        raise FusionError(f"{name}: holds only {kernel}'s prepared layout, not the {module.format.slug} tensors "
                          "to concatenate; fuse while quantizing or loading (quantize_/load_quantized with "
                          "fuse=True), or build the layers with keep_source=True")
    return module.format, source


def fuse_projections(
    model: nn.Module,
    *,
    groups: Sequence[Sequence[str]] = DEFAULT_GROUPS,
    strict: bool = True,
    prefer: str | Sequence[str] | None = None,
) -> list[str]:
    """Fuse every group of sibling quantized linears named in ``groups`` (q/k/v, gate/up,
    BERT's query/key/value by default) into one quantized linear along N; returns the
    fused modules' names. Groups made only of dense layers are not touched.

    A group that cannot be fused — parts that differ in format, bits, group size,
    ``g_idx``, rotations, in_features, activation dtype or device; a part that is dense
    or holds only a kernel's layout — is refused with the layers named and the reason:
    with ``strict`` (the default) as one :class:`~quantcore.errors.FusionError` listing
    every refusal before the model is touched, else as one warning, the other groups
    fused. The fused modules are bound for the parts' device and activation dtype
    (``prefer`` as in ``quantize_``) and keep their source if the parts did."""
    modules = dict(model.named_modules())
    linear_like = [n for n, m in modules.items() if isinstance(m, (*_LINEAR_MODULES, nn.Linear))]
    found, blocked = find_groups(model, linear_like, groups)

    def ours(group: FusionGroup) -> bool:  # groups of dense layers are not for this function
        return any(isinstance(modules[n], QuantModule) for n in group.names)

    found = [g for g in found if ours(g)]
    refused = {g.describe(): why for g, why in blocked if ours(g)}
    total = len(found) + len(refused)
    ok: list[FusionGroup] = []
    for group in found:
        why = _bound_refusal(group, modules)
        if why is None:
            ok.append(group)
        else:
            refused[group.describe()] = why

    def read(group: FusionGroup, name: str) -> tuple[Format, Mapping[str, torch.Tensor]]:
        return _bound_tensors(modules[name], name)

    def build(group: FusionGroup, fmt: Format, tensors: dict[str, torch.Tensor]) -> QuantModule:
        first = modules[group.names[0]]
        assert isinstance(first, QuantModule)
        return fused_module(fmt, tensors, device=_device(first), dtype=first.dtype, prefer=prefer,
                            keep_source=first.keep_source)

    if strict and refused:
        raise FusionError(_listing(refused))
    built, failed = build_fused(ok, read, build)
    refused.update(failed)
    if strict and refused:
        raise FusionError(_listing(refused))
    install(model, built)
    refusal_warning(refused, where="fuse_projections", total=total)
    return [g.fused_name for g in ok if g.fused_name in built]


def _listing(refused: Mapping[str, str]) -> str:
    lines = [f"fuse_projections: {len(refused)} group(s) cannot be fused (the model is unchanged):"]
    lines += [f"  {group}: {why}" for group, why in refused.items()]
    return "\n".join(lines)
