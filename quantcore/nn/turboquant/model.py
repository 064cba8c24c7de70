"""Model-level API: quantize the ``nn.Linear`` layers of a model, save, load.

    config = TurboQuantConfig(bits=4, group_size=128, residual=True)
    model = quantize_model(model, config)            # Linear → TurboQuantLinear, in place
    save_quantized(model, "model.safetensors")
    model = load_quantized(skeleton, "model.safetensors", cpu_offload_pass2=True)

The file is a plain safetensors state dict plus one metadata entry, ``quantcore``: JSON
naming the format, its parameters and the quantized modules, so a loader can rebuild the
module tree from an unquantized skeleton (built on the ``meta`` device if memory is
short). Needs the optional ``safetensors`` package (``pip install quantcore[io]``).
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from ...errors import QuantCoreError, TensorFormatError
from ...formats.turboquant.format import TurboQuant
from ...kernels.turboquant.base import ACT_DTYPES
from ...problem import MAX_DIM
from .module import TurboQuantLinear
from .offload import Pass2OffloadPool

__all__ = [
    "TurboQuantConfig",
    "TurboQuantLinear",
    "enable_pass2_offload",
    "load_quantized",
    "quantize_model",
    "save_quantized",
]

METADATA_KEY = "quantcore"


@dataclass(frozen=True)
class TurboQuantConfig:
    bits: int = 4
    group_size: int = 128
    residual: bool = False
    rotation_per_group: bool = False
    norm_dtype: str = "float16"
    #: Rotations of module ``name`` come from ``seed`` mixed with ``crc32(name)``:
    #: independent across layers, reproducible run to run.
    seed: int = 0
    #: Modules left in full precision: exact names or name suffixes (``lm_head``).
    skip: tuple[str, ...] = ("lm_head",)
    #: Keep pass 2 in pinned host memory and stream it in per layer (needs residual).
    cpu_offload_pass2: bool = False

    def format(self) -> TurboQuant:
        return TurboQuant(
            bits=self.bits, group_size=self.group_size, residual=self.residual,
            rotation_per_group=self.rotation_per_group, norm_dtype=getattr(torch, self.norm_dtype),
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "skip": list(self.skip)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TurboQuantConfig:
        return cls(**{**data, "skip": tuple(data.get("skip", ()))})


def _skipped(name: str, skip: tuple[str, ...]) -> bool:
    return any(name == s or name.endswith("." + s) for s in skip)


def _linears(model: nn.Module, config: TurboQuantConfig) -> Iterator[tuple[str, nn.Linear]]:
    for name, module in model.named_modules():
        eligible = type(module) is nn.Linear and not _skipped(name, config.skip)
        if eligible and module.in_features % config.group_size == 0:
            yield name, module


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def quantize_model(
    model: nn.Module,
    config: TurboQuantConfig,
    *,
    dtype: torch.dtype | None = None,
    keep_source: bool = False,
) -> nn.Module:
    """Replace every eligible ``nn.Linear`` (in-features a multiple of the group size, not
    in ``config.skip``) by a :class:`TurboQuantLinear`, quantizing on the layer's device and
    preparing for activations of ``dtype`` (default: each layer's weight dtype).
    ``keep_source`` keeps the format's tensors beside the prepared ones (run-time
    fallback; :func:`save_quantized` from a GPU, where rotations are prepared in 16 bits)."""
    fmt = config.format()
    for name, linear in list(_linears(model, config)):
        gen = torch.Generator().manual_seed((config.seed * 0x9E3779B1 + zlib.crc32(name.encode())) % 2**63)
        layer_dtype = dtype or (linear.weight.dtype if linear.weight.dtype in ACT_DTYPES else None)
        _replace(model, name, TurboQuantLinear.from_linear(linear, fmt, generator=gen, dtype=layer_dtype,
                                                           keep_source=keep_source))
    model.quantcore_config = config  # type: ignore[assignment]
    if config.cpu_offload_pass2:
        enable_pass2_offload(model)
    return model


def quantized_modules(model: nn.Module) -> dict[str, TurboQuantLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, TurboQuantLinear)}


def enable_pass2_offload(model: nn.Module) -> Pass2OffloadPool:
    """Move every residual pass of ``model`` to host memory, behind one shared pool."""
    pool = Pass2OffloadPool()
    found = False
    for module in quantized_modules(model).values():
        if module.fmt.residual:
            module.offload_pass2(pool)
            found = True
    if not found:
        raise TensorFormatError("cpu_offload_pass2: the model has no TurboQuant layer with a residual pass")
    return pool


def save_quantized(model: nn.Module, path: str | os.PathLike[str]) -> None:
    """Write the model's state dict and the quantization metadata to a safetensors file."""
    safetensors = _safetensors()
    modules = quantized_modules(model)
    if not modules:
        raise TensorFormatError("save_quantized: the model has no TurboQuantLinear module")
    config = getattr(model, "quantcore_config", None)
    if config is None:
        fmt = next(iter(modules.values())).fmt
        config = TurboQuantConfig(
            bits=fmt.bits, group_size=fmt.group_size, residual=fmt.residual,
            rotation_per_group=fmt.rotation_per_group, norm_dtype=str(fmt.norm_dtype).removeprefix("torch."),
        )
    meta = {
        "format": TurboQuant.name,
        "version": TurboQuant.version,
        "config": config.to_json(),
        "modules": {
            name: {"in_features": m.in_features, "out_features": m.out_features, "bias": m.has_bias}
            for name, m in modules.items()
        },
    }
    # The format's tensors of every quantized layer (not its kernel's prepared layout, which
    # depends on the device), and the state dict of everything else. Cloned so tied or
    # sliced tensors do not share storage (safetensors refuses that).
    state: dict[str, torch.Tensor] = {}
    for name, m in modules.items():
        state.update({f"{name}.{k}": v for k, v in m.tensors().items()})
    for key, value in model.state_dict().items():
        owner = key.rpartition(".")[0]
        if not any(owner == n or owner.startswith(n + ".") for n in modules):
            state[key] = value
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    safetensors.save_file(state, os.fspath(path), metadata={METADATA_KEY: json.dumps(meta)})


def load_quantized(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    device: torch.device | str | None = None,
    cpu_offload_pass2: bool | None = None,
    strict: bool = True,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Turn ``model`` (the unquantized architecture, possibly on ``meta``) into the saved
    quantized model: the listed Linears become TurboQuantLinears, then every tensor is
    loaded. ``cpu_offload_pass2`` overrides the saved configuration's choice."""
    from ...checkpoint.shards import open_shard, read_shard

    with contextlib.ExitStack() as stack:
        raw = (open_shard(Path(path), stack).metadata() or {}).get(METADATA_KEY)
    config, modules = _read_metadata(path, raw)
    fmt = config.format()
    target = torch.device(device) if device is not None else None
    layers: dict[str, TurboQuantLinear] = {}
    for name, spec in modules.items():
        try:
            old = model.get_submodule(name)
        except AttributeError:
            raise TensorFormatError(f"{path}: module {name!r} is not in the given model") from None
        if not isinstance(old, nn.Linear) or (old.in_features, old.out_features) != (spec["in_features"], spec["out_features"]):
            raise TensorFormatError(
                f"{path}: module {name!r} is saved as a {spec['in_features']} → {spec['out_features']} "
                f"linear, the model has {old!r}"
            )
        here = target or (old.weight.device if old.weight.device.type != "meta" else torch.device("cpu"))
        layer_dtype = dtype or (old.weight.dtype if old.weight.dtype in ACT_DTYPES else None)
        try:
            layers[name] = TurboQuantLinear(spec["in_features"], spec["out_features"], fmt, bias=spec["bias"],
                                            device=here, dtype=layer_dtype)
        except QuantCoreError as exc:  # what the file says cannot be built
            raise TensorFormatError(f"{path}: module {name!r}: {exc}") from None
    state = read_shard(Path(path))
    for name, layer in layers.items():
        prefix = name + "."
        try:
            layer.load_tensors({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        except QuantCoreError as exc:  # the file's tensors for this layer
            raise TensorFormatError(f"{path}: {name}: {exc}") from None
    rest = {k: v for k, v in state.items() if not any(k.startswith(n + ".") for n in layers)}
    for name, layer in layers.items():
        _replace(model, name, layer)
    try:
        model.load_state_dict(rest, strict=False, assign=True)
    except RuntimeError as exc:  # torch's size mismatch, listed for every tensor
        raise TensorFormatError(f"{path}: {str(exc).splitlines()[-1].strip()}") from None
    if strict:
        left = [k for k, v in model.state_dict().items()
                if isinstance(v, torch.Tensor) and v.device.type == "meta"]
        if left:
            raise TensorFormatError(f"{path}: no tensor for {', '.join(left[:5])}{' …' if len(left) > 5 else ''}")
    if target is not None:
        model.to(target)
    model.quantcore_config = config  # type: ignore[assignment]
    offload = config.cpu_offload_pass2 if cpu_offload_pass2 is None else cpu_offload_pass2
    if offload:
        try:
            enable_pass2_offload(model)
        except QuantCoreError as exc:  # the file's configuration asks for what its layers lack
            raise TensorFormatError(f"{path}: {exc}") from None
    return model


def _read_metadata(path: str | os.PathLike[str], raw: object) -> tuple[TurboQuantConfig, dict[str, dict[str, Any]]]:
    """The configuration and the module list ``save_quantized`` wrote, each field checked."""
    if raw is None:
        raise TensorFormatError(f"{path}: no '{METADATA_KEY}' metadata; not written by save_quantized")
    try:
        meta = json.loads(str(raw))
    except ValueError as exc:
        raise TensorFormatError(f"{path}: metadata '{METADATA_KEY}' is not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise TensorFormatError(f"{path}: metadata '{METADATA_KEY}': expected a JSON object, got {type(meta).__name__}")
    if meta.get("format") != TurboQuant.name:
        raise TensorFormatError(f"{path}: format {meta.get('format')!r}, expected {TurboQuant.name!r}")
    config_json, modules = meta.get("config"), meta.get("modules")
    names = {f.name for f in fields(TurboQuantConfig)}
    if not isinstance(config_json, dict) or not set(config_json) <= names:
        raise TensorFormatError(f"{path}: metadata config: expected an object with some of {sorted(names)}, "
                                f"got {str(config_json)[:80]}")
    try:
        config = TurboQuantConfig.from_json(config_json)
        config.format()
    except TensorFormatError as exc:
        raise TensorFormatError(f"{path}: metadata config: {exc}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise TensorFormatError(f"{path}: metadata config: {type(exc).__name__}: {exc}") from None
    if not isinstance(modules, dict):
        raise TensorFormatError(f"{path}: metadata modules: expected an object, got {type(modules).__name__}")
    for name, spec in modules.items():
        ok = isinstance(spec, dict) and all(
            type(spec.get(k)) is int and 0 < spec[k] <= MAX_DIM for k in ("in_features", "out_features")
        ) and isinstance(spec.get("bias"), bool)
        if not ok:
            raise TensorFormatError(f"{path}: metadata modules[{name!r}]: expected in_features and out_features "
                                    f"(positive integers) and bias (a bool), got {str(spec)[:80]}")
    return config, modules


def _safetensors() -> Any:
    try:
        import safetensors
        import safetensors.torch
    except ImportError as exc:  # pragma: no cover - exercised where safetensors is absent
        raise ImportError("saving and loading need safetensors: pip install 'quantcore[io]'") from exc
    return SimpleNamespace(
        safe_open=safetensors.safe_open,
        save_file=safetensors.torch.save_file,
        load_file=safetensors.torch.load_file,
    )
