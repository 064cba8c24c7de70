"""``quantcore.load_quantized``: a quantized checkpoint folder into a model, in one call.

    model = quantcore.load_quantized("path/to/Llama-3.1-8B-GPTQ", device="cuda")
    model = quantcore.load_quantized(skeleton, "path/to/checkpoint", device="cuda")

The folder is what the quantizing tools write: ``config.json`` with a
``quantization_config`` (or ``quantize_config.json`` / ``quant_config.json``) and
safetensors shards, with ``model.safetensors.index.json`` when there are several; GPTQ,
AWQ and compressed-tensors pack-quantized (docs/checkpoints.md). The config is read, and
refused where no kernel runs what it describes, before a model is built or a tensor read.
Shards are opened with ``safetensors.safe_open`` and read one layer at a time: a
quantized linear's tensors are read, checked, prepared on ``device`` for the kernel
``bind`` picks and dropped, so the checkpoint is never all in memory at once.

Nothing is half-loaded. Everything is checked before the model is touched: the index
against the shards (a shard it names that is missing, a tensor it maps to a shard that
does not hold it, a tensor a shard holds that it does not list), every quantized
linear's tensors against the config and the format (the error names the file, the layer
and the tensor), every other tensor against the model's shape, and every weight of the
model has a tensor; a GPTQ v1 checkpoint whose zero points only its (unnamed) producer
could decode is refused until ``v1_zeros`` names the rule. Only then are the new modules
swapped in and the rest assigned, and layers that keep a dense copy of their weight are
named in one warning.

A model given as a folder is built from its ``config.json`` with transformers'
``AutoModelForCausalLM.from_config``, its parameters on ``meta`` (buffers such as rotary
frequencies are computed as usual). A single ``.safetensors`` file written by TurboQuant's
``save_quantized`` loads through :func:`quantcore.nn.turboquant.load_quantized`. With
``fuse=True`` linears that read the same input (q/k/v, gate/up) are read together and
prepared as one (:mod:`quantcore.nn.fuse`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InvalidArgumentError, QuantCoreError, TensorFormatError
from ..formats.base import Format
from ..nn.linear import QuantLinear
from .config import read_quant_config, scheme_from_config
from .dense_copies import warn_dense_copies
from .scheme import CheckpointScheme
from .shards import INDEX, get_tensor, inside, open_shard, read_index, shard_names

__all__ = ["build_layers", "load_quantized", "plan_layers"]



def load_quantized(
    model_or_dir: nn.Module | str | Path,
    checkpoint_dir: str | Path | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    prefer: str | Sequence[str] | None = None,
    keep_source: bool = False,
    v1_zeros: str | None = None,
    fuse: bool = False,
) -> nn.Module:
    """Load a quantized checkpoint into ``model_or_dir`` (a module, possibly on ``meta``,
    or a model folder to build one from); ``checkpoint_dir`` defaults to that folder.
    Quantized linears become :class:`~quantcore.nn.linear.QuantLinear` modules prepared
    on ``device`` for activations of ``dtype``; other floating-point tensors take the
    model's dtype (``dtype`` for a model built here). ``v1_zeros`` (``"lanes"`` or
    ``"fields"``) names the rule of GPTQ v1 zero points whose config does not name their
    producer (:mod:`quantcore.checkpoint.producer`). ``fuse=True`` fuses the projections
    that read the same input (:mod:`quantcore.nn.fuse`), warning once for any it cannot."""
    if checkpoint_dir is None:
        if isinstance(model_or_dir, nn.Module):
            raise InvalidArgumentError("checkpoint_dir: required when the model is given as a module")
        checkpoint_dir = model_or_dir
    path = Path(checkpoint_dir)
    if path.is_file() and path.suffix == ".safetensors":
        from ..nn.turboquant.model import load_quantized as load_turboquant

        model = model_or_dir if isinstance(model_or_dir, nn.Module) else _build(Path(model_or_dir), dtype)
        model = load_turboquant(model, path, device=device, dtype=dtype)
        if fuse:  # its layers are prepared already: fuse what their prepared passes give back
            from ..nn.fuse import fuse_projections

            fuse_projections(model, strict=False)
        return model
    if not path.is_dir():
        raise TensorFormatError(f"{path}: not a checkpoint folder")
    config, source = read_quant_config(path)
    # The config is read (and refused) before a model is built or a tensor is read.
    scheme = scheme_from_config(config, str(path / source), v1_zeros=v1_zeros)
    model = model_or_dir if isinstance(model_or_dir, nn.Module) else _build(Path(model_or_dir), dtype)
    target = torch.device(device)
    with _open_shards(path) as shards:
        plan = _plan(model, shards, path, scheme)
        layers: dict[str, nn.Module] = {}
        if fuse:
            layers = _fused(model, plan, scheme, shards, target, dtype, prefer, keep_source)
        layers.update({name: _quant_linear(name, linear, scheme, shards, target, dtype, prefer, keep_source)
                       for name, linear in plan.linears.items() if name not in layers})
        dense = {key: _dense(key, like, shards) for key, like in plan.dense.items()}
    for name, layer in layers.items():
        _replace(model, name, layer)
    model.load_state_dict(dense, strict=False, assign=True)
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    warn_dense_copies(layers.items(), f"load_quantized {path}")
    return model.to(target)


def plan_layers(model: nn.Module, folder: str | Path, scheme: CheckpointScheme) -> dict[str, nn.Linear]:
    """Every check :func:`load_quantized` makes before touching the model (except the
    dense tensors, which a caller such as transformers loads itself): the quantized
    linears of ``folder`` and the model's modules they replace."""
    path = Path(folder)
    with _open_shards(path) as shards:
        return _plan(model, shards, path, scheme, dense=False).linears


def build_layers(
    folder: str | Path, scheme: CheckpointScheme, linears: dict[str, nn.Linear], *,
    device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
    prefer: str | Sequence[str] | None = None, keep_source: bool = False,
) -> dict[str, QuantLinear]:
    """The :class:`QuantLinear` of each planned layer, read one layer at a time."""
    with _open_shards(Path(folder)) as shards:
        return {name: _quant_linear(name, linear, scheme, shards, torch.device(device), dtype, prefer, keep_source)
                for name, linear in linears.items()}


# --- shards ------------------------------------------------------------------------------------


class _Shards:
    """Every shard of a folder open at once; ``where[name]`` is the file holding a tensor."""

    def __init__(self, folder: Path, stack: contextlib.ExitStack) -> None:
        index_path = folder / INDEX
        weight_map = read_index(folder)
        self.files: dict[str, Any] = {}
        self.paths: dict[str, Path] = {}
        self.where: dict[str, str] = {}
        for file in shard_names(folder, weight_map):
            path = inside(folder, file, index_path)
            if not path.exists():
                raise TensorFormatError(f"{index_path}: names shard {file}, which is not in {folder}")
            handle = open_shard(path, stack)
            self.files[file], self.paths[file] = handle, path
            for name in handle.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
                if name in self.where:
                    raise TensorFormatError(f"{folder}: tensor {name} is in {self.where[name]} and again in {file}")
                self.where[name] = file
        if weight_map is not None:
            for name, file in weight_map.items():
                if self.where.get(name) != file:
                    held = f"it is in {self.where[name]}" if name in self.where else "no shard holds it"
                    raise TensorFormatError(f"{index_path}: maps {name} to {file}, but {held}")
            extra = sorted(set(self.where) - set(weight_map))
            if extra:
                raise TensorFormatError(f"{folder / self.where[extra[0]]}: holds {extra[0]}, which {INDEX} does not list")

    def get(self, name: str) -> torch.Tensor:
        file = self.where[name]
        return get_tensor(self.files[file], self.paths[file], name)

    def file_of(self, name: str) -> str:
        return self.where.get(name, "?")


@contextlib.contextmanager
def _open_shards(folder: Path) -> Iterator[_Shards]:
    with contextlib.ExitStack() as stack:
        yield _Shards(folder, stack)


# --- planning: every check before the model is touched -----------------------------------------


class _Plan:
    def __init__(self) -> None:
        self.linears: dict[str, nn.Linear] = {}
        #: state-dict key → the model's tensor it replaces (for shape and dtype)
        self.dense: dict[str, torch.Tensor] = {}


def _plan(model: nn.Module, shards: _Shards, folder: Path, scheme: CheckpointScheme, *, dense: bool = True) -> _Plan:
    plan = _Plan()
    modules = dict(model.named_modules())
    marker = scheme.marker
    prefixes = scheme.layers(shards.where)
    if not prefixes:
        raise TensorFormatError(f"{folder}: no quantized linear (no tensor named '<prefix>.{marker}')")
    for prefix in prefixes:
        target = modules.get(prefix)
        file = folder / shards.file_of(f"{prefix}.{marker}")
        if not isinstance(target, nn.Linear):
            found = type(target).__name__ if target is not None else "nothing"
            raise TensorFormatError(f"{file}: {prefix}: the model has {found} there, not an nn.Linear")
        try:
            scheme.format_for(prefix, target)
            scheme.survey(prefix, lambda leaf, p=prefix: shards.get(f"{p}.{leaf}"))  # type: ignore[misc]
        except QuantCoreError as exc:
            raise type(exc)(f"{file}: {exc}") from None
        plan.linears[prefix] = target
    for name, module in modules.items():
        if name not in plan.linears and scheme.expects_quantized(name, module):
            held = f"holds {name}.weight" if f"{name}.weight" in shards.where else f"has no {name}.{marker}"
            raise TensorFormatError(
                f"{folder}: {name}.{marker}: the config quantizes {name}, but the checkpoint {held}; expected "
                f"its {marker} (or the layer in the config's 'ignore')"
            )
    scheme.decide()
    if not dense:
        return plan
    quantized = {f"{p}.{leaf}" for p in prefixes for leaf in ("weight", "bias")}
    missing = []
    for key, tensor in _weights(model):
        if key in quantized:
            continue
        if key in shards.where:
            plan.dense[key] = tensor
        elif tensor.device.type == "meta":
            missing.append(key)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise TensorFormatError(f"{folder}: no tensor for the model's {', '.join(missing[:3])}{more}")
    return plan


def _weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter and buffer once (a tied weight under its first name), with the
    state-dict key it loads from; non-persistent buffers only when they are still meta."""
    seen: set[int] = set()
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        for leaf, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            if leaf in module._non_persistent_buffers_set and t.device.type != "meta":
                continue
            yield prefix + leaf, t


# --- building -----------------------------------------------------------------------------------


def _quant_linear(
    name: str, linear: nn.Linear, scheme: CheckpointScheme, shards: _Shards, device: torch.device,
    dtype: torch.dtype, prefer: str | Sequence[str] | None, keep_source: bool,
) -> QuantLinear:
    with _naming(name, scheme, shards):
        read_as, tensors = _read_linear(name, linear, scheme, shards)
        return QuantLinear(read_as, tensors, device=device, dtype=dtype, prefer=prefer, keep_source=keep_source)


def _read_linear(
    name: str, linear: nn.Linear, scheme: CheckpointScheme, shards: _Shards
) -> tuple[Format, dict[str, torch.Tensor]]:
    """A quantized linear's tensors, checked against the config, the format and the model,
    in the kernel's format."""
    tensors = {leaf: shards.get(f"{name}.{leaf}") for leaf in scheme.leaves if f"{name}.{leaf}" in shards.where}
    dims = scheme.check(name, tensors, linear)
    if (dims["K"], dims["N"]) != (linear.in_features, linear.out_features):
        raise TensorFormatError(
            f"{name}: the checkpoint's linear is {dims['K']} → {dims['N']}, the model's is "
            f"{linear.in_features} → {linear.out_features}"
        )
    return scheme.to_kernel(name, tensors, linear)


@contextlib.contextmanager
def _naming(name: str, scheme: CheckpointScheme, shards: _Shards) -> Iterator[None]:
    """An error about a layer names its file and the layer."""
    try:
        yield
    except QuantCoreError as exc:
        message = str(exc) if str(exc).startswith(name) else f"{name}: {exc}"
        raise type(exc)(f"{shards.file_of(f'{name}.{scheme.marker}')}: {message}") from None


def _fused(
    model: nn.Module, plan: _Plan, scheme: CheckpointScheme, shards: _Shards, device: torch.device,
    dtype: torch.dtype, prefer: str | Sequence[str] | None, keep_source: bool,
) -> dict[str, nn.Module]:
    """The fused modules and their slices for every group of projections the plan holds;
    a group that cannot be fused is read layer by layer afterwards (its errors raised there)."""
    from ..nn.fuse import build_fused, find_groups, fused_module, refusal_warning

    groups, blocked = find_groups(model, plan.linears)
    modules, refused = build_fused(
        groups,
        read=lambda group, name: _read_linear(name, plan.linears[name], scheme, shards),
        build=lambda group, read_as, tensors: fused_module(read_as, tensors, device=device, dtype=dtype,
                                                           prefer=prefer, keep_source=keep_source),
        skip_unreadable=True,
    )
    refusal_warning({**{g.describe(): why for g, why in blocked}, **refused}, where="load_quantized",
                    total=len(groups) + len(blocked))
    return modules


def _dense(key: str, like: torch.Tensor, shards: _Shards) -> torch.Tensor:
    t = shards.get(key)
    if t.shape != like.shape:
        raise TensorFormatError(
            f"{shards.file_of(key)}: {key}: expected shape {tuple(like.shape)} (the model's), got {tuple(t.shape)}"
        )
    if t.is_floating_point() and like.is_floating_point():
        t = t.to(like.dtype)
    elif t.dtype != like.dtype:
        raise TensorFormatError(f"{shards.file_of(key)}: {key}: expected {like.dtype} (the model's), got {t.dtype}")
    return t


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _build(folder: Path, dtype: torch.dtype) -> nn.Module:
    """The model a folder's config.json describes, parameters on meta (buffers real)."""
    try:
        import transformers
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("building a model from a folder needs transformers; or pass the model itself") from None
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder))
        with _params_on_meta():
            # transformers 5 renamed torch_dtype to dtype (4.x only knows the old name).
            key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
            model = transformers.AutoModelForCausalLM.from_config(config, **{key: dtype})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # transformers' own, on its config
        raise TensorFormatError(f"{folder / 'config.json'}: transformers cannot build a model from it "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    return model.eval()


@contextlib.contextmanager
def _params_on_meta() -> Iterator[None]:
    """Parameters created on ``meta`` (no memory, no init), buffers as usual: rotary
    frequencies and masks are computed at init and rarely saved."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]

