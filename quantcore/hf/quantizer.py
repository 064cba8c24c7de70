"""``QuantCoreHfQuantizer``: transformers' hooks around ``from_pretrained`` and
``save_pretrained`` for quant_method ``quantcore``.

A quantized checkpoint:

1. before the weights load, the checkpoint's config is read into a scheme (every
   refusal of the config here) and :func:`~quantcore.checkpoint.load.plan_layers`
   makes every check ``load_quantized`` makes; each quantized linear is replaced by a
   :class:`PendingLayer`, which has no state for transformers to load or initialise,
   and the quantized tensors are marked as expected-unused;
2. transformers loads the dense tensors (embeddings, norms, unquantized heads);
3. after, :func:`~quantcore.checkpoint.load.build_layers` reads each quantized layer
   from the shards, one at a time, and binds it on the device of the model's weights.

A dense checkpoint with ``QuantCoreConfig(quantize=...)`` loads as usual and is then
quantized with :func:`quantcore.quantize_`. ``save_pretrained`` writes each quantized
layer as its checkpoint tensors — re-read from the checkpoint it came from, or the kept
tensors of a layer quantized on load — with the config that names them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers.quantizers.auto import register_quantizer
from transformers.quantizers.base import HfQuantizer

from ..api import get_format
from ..checkpoint.config import QUANTCORE_METHOD, scheme_from_config
from ..checkpoint.dense_copies import warn_dense_copies
from ..checkpoint.load import build_layers, plan_layers
from ..checkpoint.writer import config_for as checkpoint_config_for
from ..checkpoint.writer import unwritable
from ..errors import InvalidArgumentError
from ..nn.linear import QuantLinear
from ..nn.quant_module import SOURCE
from ..nn.quantize import quantize_
from .config import QuantCoreConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["QuantCoreHfQuantizer"]


class PendingLayer(nn.Module):
    """Where a quantized linear goes while transformers loads the rest: no parameters, no
    buffers; replaced by its :class:`QuantLinear` once the weights are loaded."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise InvalidArgumentError("quantcore: this layer is still loading (from_pretrained did not finish)")


@register_quantizer(QUANTCORE_METHOD)
class QuantCoreHfQuantizer(HfQuantizer):
    requires_calibration = False
    quantization_config: QuantCoreConfig

    def __init__(self, quantization_config: QuantCoreConfig, **kwargs: Any) -> None:
        super().__init__(quantization_config, **kwargs)
        self.folder: Path | None = None
        self.scheme: Any = None
        self.planned: dict[str, nn.Linear] = {}
        #: Why save_pretrained cannot write this model ("" when it can): a format quantized
        #: while loading that no checkpoint is written in.
        self.unsaveable = ""

    def validate_environment(self, *args: Any, **kwargs: Any) -> None:
        cfg = self.quantization_config
        if self.pre_quantized:
            self._checkpoint_config()
        elif cfg.quantize is None:
            raise InvalidArgumentError("QuantCoreConfig: the model is not quantized; give quantize={'name': ...} "
                                       "to quantize it while it loads")

    def _checkpoint_config(self) -> dict[str, Any]:
        """The quantized checkpoint's own quantization config, which its QuantCoreConfig holds."""
        checkpoint = self.quantization_config.checkpoint
        if checkpoint is None:
            raise InvalidArgumentError(
                "QuantCoreConfig: this checkpoint is quantized but its quantization config holds no 'checkpoint' "
                "(the checkpoint's own config); load it with config=quantcore.hf.config_for(path)"
            )
        return checkpoint

    # --- before the weights --------------------------------------------------------------

    def _process_model_before_weight_loading(self, model: PreTrainedModel, **kwargs: Any) -> PreTrainedModel:
        if not self.pre_quantized:
            return model
        files = kwargs.get("checkpoint_files") or []
        if not files:
            raise InvalidArgumentError("quantcore: a quantized checkpoint loads from safetensors files; none were found")
        self.folder = Path(files[0]).parent
        cfg = self.quantization_config
        self.scheme = scheme_from_config(self._checkpoint_config(), str(self.folder / "config.json"),
                                         v1_zeros=cfg.v1_zeros)
        self.planned = plan_layers(model, self.folder, self.scheme)
        for name, linear in self.planned.items():
            _replace(model, name, PendingLayer(linear.in_features, linear.out_features))
        leaves = "|".join(re.escape(leaf) for leaf in self.scheme.leaves)
        names = "|".join(re.escape(name) for name in self.planned)
        unused = {rf"^(?:{names})\.(?:{leaves})$"}
        model._keys_to_ignore_on_load_unexpected = set(model._keys_to_ignore_on_load_unexpected or ()) | unused
        return model

    # --- after the weights ---------------------------------------------------------------

    def _process_model_after_weight_loading(self, model: PreTrainedModel, **kwargs: Any) -> PreTrainedModel:
        cfg = self.quantization_config
        dtype = _model_dtype(model)
        device = _model_device(model)
        if self.pre_quantized:
            if self.folder is None:
                raise InvalidArgumentError("quantcore: the weights of a quantized checkpoint were loaded before "
                                           "its quantized layers were planned; load it with from_pretrained")
            layers = build_layers(self.folder, self.scheme, self.planned, device=device, dtype=dtype,
                                  prefer=cfg.prefer)
            for name, layer in layers.items():
                _replace(model, name, layer)
            warn_dense_copies(layers.items(), f"from_pretrained {self.folder}", stacklevel=2)
            return model
        assert cfg.quantize is not None
        params = dict(cfg.quantize)
        fmt = get_format(params.pop("name"), **params)
        skip = set(cfg.modules_to_not_convert if cfg.modules_to_not_convert is not None
                   else self.get_modules_to_not_convert(model, add_default_skips=True))
        # A format no checkpoint is written in still loads and runs; only saving it is refused.
        self.unsaveable = unwritable(fmt)
        quantize_(model, fmt, filter_fn=lambda m, name: name not in skip, dtype=dtype, prefer=cfg.prefer,
                  keep_source=not self.unsaveable)
        if not self.unsaveable:
            cfg.checkpoint = checkpoint_config_for(fmt)
            cfg.quantize = None
        return model

    # --- saving -------------------------------------------------------------------------------

    def is_serializable(self, safe_serialization: bool | None = None) -> bool:
        """transformers asks before it saves; a model it cannot save is refused here, with
        the reason (transformers' own refusal would not say it)."""
        if self.unsaveable:
            raise InvalidArgumentError(f"save_pretrained: this model was quantized while loading, and {self.unsaveable}; "
                                       "quantize with gptq or awq to save it")
        return True

    @property
    def is_trainable(self) -> bool:
        return False

    def get_state_dict_and_metadata(self, model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The model's tensors with each quantized layer as its checkpoint tensors."""
        quantized = {name: m for name, m in model.named_modules() if isinstance(m, QuantLinear)}
        state = {k: v for k, v in model.state_dict().items()
                 if not any(k.startswith(f"{name}.") for name in quantized)}
        for name, layer in quantized.items():
            for leaf, tensor in self._checkpoint_tensors(name, layer).items():
                state[f"{name}.{leaf}"] = tensor.contiguous()
        return state, {}

    def _checkpoint_tensors(self, name: str, layer: QuantLinear) -> dict[str, torch.Tensor]:
        kept = {n[len(SOURCE):]: t.cpu() for n, t in layer.named_buffers(recurse=False) if n.startswith(SOURCE)}
        if kept:
            return kept
        if self.folder is None or name not in self.planned:
            raise InvalidArgumentError(f"{name}: quantcore cannot save this layer: it was neither loaded from a "
                                       "checkpoint nor quantized while loading")
        return _read_layer(self.folder, name, self.scheme.leaves)


def _read_layer(folder: Path, name: str, leaves: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """One layer's tensors, re-read from the shards it was loaded from."""
    import contextlib

    from ..checkpoint.shards import INDEX, get_tensor, inside, open_shard, read_index, shard_names

    weight_map = read_index(folder)
    out: dict[str, torch.Tensor] = {}
    with contextlib.ExitStack() as stack:
        handles = {}
        for file in shard_names(folder, weight_map):
            path = inside(folder, file, folder / INDEX)
            handles[file] = (open_shard(path, stack), path)
        for leaf in leaves:
            key = f"{name}.{leaf}"
            for file, (handle, path) in handles.items():
                if (weight_map is None or weight_map.get(key) == file) and key in handle.keys():  # noqa: SIM118
                    out[leaf] = get_tensor(handle, path, key)
                    break
    return out


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _model_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point() and p.device.type != "meta":
            return p.dtype
    return torch.bfloat16


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")
