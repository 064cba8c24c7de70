"""``QuantCoreConfig``: the quantization config transformers reads for quant_method
``quantcore``, registered with ``register_quantization_config``.

transformers builds the config class a checkpoint's ``quant_method`` names, and refuses a
``quantization_config=`` argument of another class; so a GPTQ, AWQ or compressed-tensors
checkpoint reaches quantcore through its model config: :func:`config_for` is the
checkpoint's config with its ``quantization_config`` wrapped as
``{"quant_method": "quantcore", "checkpoint": <the original>, ...options}``, which is also
what ``save_pretrained`` writes. Given as ``quantization_config=`` for a model that is not
quantized, ``QuantCoreConfig(quantize={...})`` quantizes it while it loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig
from transformers.quantizers.auto import register_quantization_config
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..checkpoint.config import QUANTCORE_METHOD, read_quant_config, unwrap
from ..checkpoint.producer import V1_RULES
from ..errors import InvalidArgumentError, TensorFormatError

__all__ = ["QuantCoreConfig", "config_for"]


@register_quantization_config(QUANTCORE_METHOD)
class QuantCoreConfig(QuantizationConfigMixin):
    """Options of a model loaded through quantcore.

    * ``checkpoint``: the checkpoint's own quantization config (``quant_method`` gptq, awq
      or compressed-tensors); None for a model quantized while it loads;
    * ``quantize``: the format to quantize a dense model with, as
      :func:`quantcore.get_format` parameters (``{"name": "gptq", "bits": 4,
      "group_size": 128}``); its layers are kept in their checkpoint form as well, so
      ``save_pretrained`` can write them;
    * ``v1_zeros``: the rule of GPTQ v1 zero points whose producer the config does not
      name (``"lanes"`` or ``"fields"``);
    * ``prefer``: kernel names to prefer, as for :func:`quantcore.bind`;
    * ``modules_to_not_convert``: names of linears a ``quantize`` run leaves dense (by
      default the output embedding, as transformers' quantizers do).
    """

    def __init__(self, checkpoint: dict[str, Any] | None = None, quantize: dict[str, Any] | None = None,
                 v1_zeros: str | None = None, prefer: list[str] | None = None,
                 modules_to_not_convert: list[str] | None = None, **kwargs: Any) -> None:
        # transformers types quant_method as its enum of built-in methods, yet a method
        # registered with register_quantization_config is a plain string.
        self.quant_method = QUANTCORE_METHOD  # type: ignore[assignment]
        if checkpoint is not None and quantize is not None:
            raise InvalidArgumentError("QuantCoreConfig: give checkpoint (a quantized checkpoint's config) or "
                                       "quantize (a format for a dense model), not both")
        if v1_zeros is not None and v1_zeros not in V1_RULES:
            raise InvalidArgumentError(f"QuantCoreConfig v1_zeros: expected one of {V1_RULES}, got {v1_zeros!r}")
        if checkpoint is not None and not isinstance(checkpoint, dict):
            raise InvalidArgumentError(f"QuantCoreConfig checkpoint: expected the checkpoint's quantization config "
                                       f"(a dict), got {checkpoint!r:.80}")
        if prefer is not None and (isinstance(prefer, str) or not all(isinstance(p, str) for p in prefer)):
            raise InvalidArgumentError(f"QuantCoreConfig prefer: expected a list of kernel names, got {prefer!r:.80}")
        if quantize is not None and not (isinstance(quantize, dict) and isinstance(quantize.get("name"), str)):
            raise InvalidArgumentError(f"QuantCoreConfig quantize: expected format parameters with a 'name' "
                                       f"(e.g. {{'name': 'gptq', 'bits': 4}}), got {quantize!r}")
        self.checkpoint = checkpoint
        self.quantize = quantize
        self.v1_zeros = v1_zeros
        self.prefer = list(prefer) if prefer else None
        self.modules_to_not_convert = modules_to_not_convert

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"quant_method": QUANTCORE_METHOD}
        for key in ("checkpoint", "quantize", "v1_zeros", "prefer", "modules_to_not_convert"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def config_for(path: str | Path, **options: Any) -> PretrainedConfig:
    """The model config of a quantized checkpoint folder, its quantization config handed
    to quantcore: pass it as ``from_pretrained(path, config=...)``. ``options`` are
    :class:`QuantCoreConfig`'s (``v1_zeros``, ``prefer``)."""
    checkpoint, source = read_quant_config(path)  # refuses a malformed config.json first, naming it
    try:
        config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:  # transformers' own, on its config
        raise TensorFormatError(f"{Path(path) / 'config.json'}: transformers cannot read it "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    checkpoint = unwrap(checkpoint, str(Path(path) / source))
    config.quantization_config = QuantCoreConfig(checkpoint=checkpoint, **options).to_dict()
    return config
