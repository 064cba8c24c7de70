"""A compressed-tensors ``quantization_config``: which layer holds which pack-quantized
scheme, and every variant no quantcore kernel runs refused by name before a tensor is read.

What is read (docs/checkpoints.md says the same for users):

* ``config_groups``: named schemes, each with ``targets`` and ``weights`` (``num_bits``,
  ``type``, ``symmetric``, ``strategy``, ``group_size``, ``actorder``) and optionally its
  own ``format``; the top-level ``format`` applies to groups without one
  (``mixed-precision`` means every group names its own);
* a target or an ``ignore`` entry matches a module by its exact name, by a regular
  expression written ``re:<pattern>`` (matched from the start of the name), or by the name
  of its class or any base class (``Linear``);
* a module matched by several groups takes the group of its most specific target: an
  exact name first, then regular expressions in sorted order, then class names; a target
  listed by two groups belongs to the later one.

Refused, naming the group and the field: float weights, activation quantization,
per-tensor (and block, token) scales, dynamic weights, formats other than
``pack-quantized``, 2:4 (and other) sparsity, KV-cache quantization, transforms
(rotations), MoE sparsity, and checkpoints whose ``quantization_status`` is not
``compressed`` (their weights are stored dense).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..errors import TensorFormatError
from ..formats.compressed_tensors import CompressedTensors

__all__ = ["METHOD", "CompressedConfig", "parse_compressed_config"]

METHOD = "compressed-tensors"
PACKED = "pack-quantized"
#: ``actorder`` values that store ``weight_g_idx`` (the others reorder only during calibration).
GROUP_ORDER = ("group", "dynamic")
STATIC_ORDER = (None, False, "weight", "static")


@dataclass(frozen=True)
class Group:
    name: str
    targets: tuple[str, ...]
    format: CompressedTensors


@dataclass(frozen=True)
class CompressedConfig:
    """The parsed config: its groups (in file order) and the ignore list."""

    groups: tuple[Group, ...]
    ignore: tuple[str, ...]
    where: str

    def group_for(self, name: str, module: nn.Module | None = None) -> Group | None:
        """The group that quantizes the module ``name`` (``module`` gives class-name
        targets something to match; without it a layer is taken for an ``nn.Linear``,
        the only module pack-quantized stores); None when no group targets it or it is
        ignored."""
        if self.ignored(name, module):
            return None
        classes = _class_names(module)
        by_target: dict[str, Group] = {}
        for group in self.groups:
            for target in group.targets:
                by_target[target] = group
        exact = [t for t in by_target if not t.startswith("re:") and t == name]
        regex = sorted(t for t in by_target if t.startswith("re:") and _matches(name, (), t))
        klass = sorted(t for t in by_target if not t.startswith("re:") and t in classes)
        for target in (*exact, *regex, *klass):
            return by_target[target]
        return None

    def ignored(self, name: str, module: nn.Module | None = None) -> bool:
        classes = _class_names(module)
        return any(_matches(name, classes, t) for t in self.ignore)

    def format_for(self, name: str, module: nn.Module | None = None) -> CompressedTensors | None:
        group = self.group_for(name, module)
        return group.format if group is not None else None


def _class_names(module: nn.Module | None) -> tuple[str, ...]:
    if module is None:
        return ("Linear",)
    return tuple(c.__name__ for c in type(module).__mro__ if issubclass(c, nn.Module))


def _matches(name: str, classes: Sequence[str], target: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name or target in classes


def _refuse(where: str, field: str, got: Any, expected: str) -> TensorFormatError:
    return TensorFormatError(f"{where}: {field}: {got!r} is not supported; expected {expected}")


def parse_compressed_config(cfg: Mapping[str, Any], where: str) -> CompressedConfig:
    """Read a compressed-tensors config; refuse what no quantcore kernel runs."""
    where = f"{where} quantization_config"
    status = cfg.get("quantization_status", "compressed")
    if status != "compressed":
        raise _refuse(where, "quantization_status", status,
                      "'compressed' (any other status stores the weights dense, not pack-quantized)")
    for key, what in (("sparsity_config", "sparsity (2:4 or bitmask)"), ("transform_config", "transforms (rotations)"),
                      ("kv_cache_scheme", "KV-cache quantization"), ("moe_sparsity_config", "MoE expert sparsity")):
        if cfg.get(key):
            detail = cfg[key].get("format", cfg[key]) if isinstance(cfg[key], Mapping) else cfg[key]
            raise TensorFormatError(f"{where}: {key}: {what} is not supported (got {detail!r}); expected none")
    top = cfg.get("format") or PACKED
    if top not in (PACKED, "mixed-precision"):
        raise _refuse(where, "format", top, f"{PACKED!r} (integer weights packed into int32)")
    raw_groups = cfg.get("config_groups")
    if not isinstance(raw_groups, Mapping) or not raw_groups:
        raise TensorFormatError(f"{where}: config_groups: expected a non-empty object of schemes, got {raw_groups!r}")
    groups = tuple(_group(str(name), scheme, top, where) for name, scheme in raw_groups.items())
    ignore = cfg.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(t, str) for t in ignore):
        raise TensorFormatError(f"{where}: ignore: expected a list of module names or 're:' patterns, got {ignore!r}")
    for target in (*ignore, *(t for g in groups for t in g.targets)):
        _compile(target, where)
    return CompressedConfig(groups, tuple(ignore), where)


def _compile(target: str, where: str) -> None:
    if target.startswith("re:"):
        try:
            re.compile(target[3:])
        except re.error as exc:
            raise TensorFormatError(f"{where}: target {target!r}: not a valid regular expression ({exc})") from None


def _group(name: str, scheme: Any, top: str, where: str) -> Group:
    here = f"{where} config_groups.{name}"
    if not isinstance(scheme, Mapping):
        raise TensorFormatError(f"{here}: expected a scheme object (targets, weights), got {scheme!r}")
    targets = scheme.get("targets")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise TensorFormatError(f"{here}: targets: expected a non-empty list of names, got {targets!r}")
    fmt = scheme.get("format") or top
    if fmt != PACKED:
        expected = f"{PACKED!r}" + (" (a mixed-precision config names each group's format)" if fmt == "mixed-precision" else "")
        raise _refuse(here, "format", fmt, expected)
    for key in ("input_activations", "output_activations"):
        if scheme.get(key):
            raise _refuse(here, key, scheme[key].get("type", scheme[key]) if isinstance(scheme[key], Mapping) else scheme[key],
                          "none: activation quantization has no quantcore kernel (weight-only schemes load)")
    weights = scheme.get("weights")
    if not isinstance(weights, Mapping):
        raise TensorFormatError(f"{here}: weights: expected the weight quantization args, got {weights!r}")
    return Group(name, tuple(targets), _weight_format(weights, f"{here}.weights"))


def _weight_format(w: Mapping[str, Any], here: str) -> CompressedTensors:
    kind = str(w.get("type", "int")).lower()
    if kind != "int":
        raise _refuse(here, "type", kind, "'int' (float weight formats have no quantcore kernel)")
    if w.get("dynamic"):
        raise _refuse(here, "dynamic", w["dynamic"], "false (weights with static scales)")
    group_size = w.get("group_size")
    strategy = w.get("strategy")
    if strategy is None:  # compressed-tensors infers it from group_size
        strategy = "tensor" if group_size is None else "group" if group_size > 0 else "channel"
    strategy = str(strategy).lower()
    if strategy == "group":
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0:
            raise _refuse(here, "group_size", group_size, "a positive int for the 'group' strategy")
    elif strategy == "channel":
        group_size = -1
    else:
        what = {"tensor": "per-tensor scales", "block": "block scales", "token": "per-token scales",
                "tensor_group": "two-level (tensor-group) scales"}.get(strategy, "this strategy")
        raise _refuse(here, "strategy", strategy, f"'group' or 'channel' ({what} have no quantcore kernel)")
    order = w.get("actorder")
    if order not in (*GROUP_ORDER, *STATIC_ORDER):
        raise _refuse(here, "actorder", order, "'group', 'weight' or none")
    scale_dtype = w.get("scale_dtype")
    if scale_dtype not in (None, "torch.float16", "torch.bfloat16", "torch.float32", "float16", "bfloat16", "float32"):
        raise _refuse(here, "scale_dtype", scale_dtype, "a 16- or 32-bit float")
    bits = w.get("num_bits", 8)
    if bits not in CompressedTensors.SUPPORTED_BITS:
        raise _refuse(here, "num_bits", bits, f"one of {CompressedTensors.SUPPORTED_BITS}")
    return CompressedTensors(bits=int(bits), group_size=int(group_size), sym=bool(w.get("symmetric", True)),
                             act_order=order in GROUP_ORDER)
