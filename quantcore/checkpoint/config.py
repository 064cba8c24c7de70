"""Quantization configs → a Format.

Where each tool writes its parameters:

* Hugging Face ``config.json``: ``quantization_config`` with ``quant_method`` "gptq"
  (bits, group_size, desc_act, sym, static_groups, checkpoint_format "gptq"/"gptq_v2")
  or "awq" (bits, group_size, zero_point, version "gemm");
* AutoGPTQ / GPTQModel ``quantize_config.json``: the same GPTQ keys at top level
  (GPTQModel also writes ``format`` for checkpoint_format, and ``pack_dtype``);
* AutoAWQ ``quant_config.json``: ``w_bit``, ``q_group_size``, ``zero_point``, ``version``;
* compressed-tensors (llm-compressor) ``config.json``: ``quant_method``
  "compressed-tensors" with ``config_groups`` (:mod:`.compressed`).

:func:`scheme_from_config` is what the loaders use: it also says how each layer is named
and read (:mod:`.scheme`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import TensorFormatError
from ..files import read_json
from ..formats.awq import AWQ
from ..formats.base import Format
from ..formats.gptq import GPTQ
from .compressed import METHOD as COMPRESSED_METHOD
from .compressed import parse_compressed_config
from .producer import V1Reader, detect_producer
from .scheme import CheckpointScheme, CompressedScheme, SingleFormatScheme

__all__ = ["CONFIG_FILES", "QUANTCORE_METHOD", "format_from_config", "read_quant_config", "scheme_from_config", "unwrap"]

#: Searched in this order; the first that holds a quantization config wins.
CONFIG_FILES = ("config.json", "quantize_config.json", "quant_config.json")


def read_quant_config(folder: str | Path) -> tuple[dict[str, Any], str]:
    """The quantization config of a checkpoint folder and the file it came from."""
    folder = Path(folder)
    for name in CONFIG_FILES:
        path = folder / name
        if not path.exists():
            continue
        data = read_json(path)
        if name == "config.json":
            if not isinstance(data, dict):
                raise TensorFormatError(f"{path}: expected a JSON object, got {type(data).__name__}")
            data = data.get("quantization_config")
            if data is None:
                continue
        if not isinstance(data, dict):
            raise TensorFormatError(f"{path}: expected a JSON object for the quantization config")
        return data, name
    raise TensorFormatError(
        f"{folder}: no quantization config found; expected config.json with a "
        f"'quantization_config', or one of {', '.join(CONFIG_FILES[1:])}"
    )


def _get(cfg: dict[str, Any], *keys: str, default: Any = None, where: str = "") -> Any:
    for key in keys:
        if key in cfg:
            return cfg[key]
    if default is None:
        raise TensorFormatError(f"{where}: missing '{keys[0]}'")
    return default


#: quant_method of a checkpoint saved through quantcore's Hugging Face quantizer; the
#: checkpoint's own config is under "checkpoint" (quantcore/hf).
QUANTCORE_METHOD = "quantcore"


def unwrap(cfg: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """The checkpoint's own quantization config (a ``quantcore`` one holds it inside)."""
    if str(cfg.get("quant_method", "")).lower() != QUANTCORE_METHOD:
        return cfg
    inner = cfg.get("checkpoint")
    if not isinstance(inner, dict):
        raise TensorFormatError(f"{source} quantization config: checkpoint: expected the checkpoint's own "
                                f"quantization config (quant_method gptq, awq or compressed-tensors), got {inner!r}")
    return inner


def _method(cfg: dict[str, Any], source: str) -> str:
    method = cfg.get("quant_method")
    if method is None:
        # AutoAWQ's quant_config.json has no quant_method; its keys give it away.
        method = "awq" if ("w_bit" in cfg or source == "quant_config.json") else "gptq"
    return str(method).lower()


def scheme_from_config(cfg: dict[str, Any], source: str = "config", *,
                       v1_zeros: str | None = None) -> CheckpointScheme:
    """How a checkpoint with this quantization config is read; every refusal of the
    config itself happens here, before a tensor is read. ``v1_zeros`` names the rule of
    a GPTQ v1 checkpoint's zero points (:mod:`.producer`)."""
    cfg = unwrap(cfg, source)
    if _method(cfg, source) == COMPRESSED_METHOD:
        return CompressedScheme(parse_compressed_config(cfg, source), source)
    fmt = format_from_config(cfg, source)
    return SingleFormatScheme(fmt, V1Reader(fmt, detect_producer(cfg), source=source, v1_zeros=v1_zeros))


def format_from_config(cfg: dict[str, Any], source: str = "config") -> Format:
    """Build the Format a quantization config describes; errors name the field. A
    compressed-tensors config gives its one group's format (several groups: see
    :func:`scheme_from_config`)."""
    where = f"{source} quantization config"
    cfg = unwrap(cfg, source)
    method = _method(cfg, source)
    if method == COMPRESSED_METHOD:
        groups = parse_compressed_config(cfg, source).groups
        if len({g.format for g in groups}) != 1:
            raise TensorFormatError(f"{where}: config_groups: {len(groups)} groups with different schemes; the "
                                    "format depends on the layer (use scheme_from_config)")
        return groups[0].format
    if method == "gptq":
        if cfg.get("dynamic"):
            raise TensorFormatError(f"{where}: 'dynamic' per-module overrides are not supported")
        ckpt = str(_get(cfg, "checkpoint_format", "format", default="gptq", where=where)).lower()
        params = {
            "bits": _get(cfg, "bits", where=where),
            "group_size": _get(cfg, "group_size", default=-1, where=where),
            "sym": _get(cfg, "sym", default=True, where=where),
            "desc_act": _get(cfg, "desc_act", default=False, where=where),
            "static_groups": _get(cfg, "static_groups", default=False, where=where),
            "checkpoint_format": ckpt,
            "pack_dtype": str(_get(cfg, "pack_dtype", default="int32", where=where)),
        }
        cls: type[Format] = GPTQ
    elif method == "awq":
        params = {
            "bits": _get(cfg, "bits", "w_bit", where=where),
            "group_size": _get(cfg, "group_size", "q_group_size", default=-1, where=where),
            "zero_point": _get(cfg, "zero_point", default=True, where=where),
            "layout": str(_get(cfg, "version", default="gemm", where=where)).lower(),
        }
        cls = AWQ
    else:
        raise TensorFormatError(
            f"{where}: quant_method {method!r} is not supported; expected 'gptq', 'awq' or '{COMPRESSED_METHOD}'"
        )
    try:
        return cls.from_params(**params)
    except TensorFormatError as exc:
        raise TensorFormatError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise TensorFormatError(f"{where}: {exc}") from None
