"""Writing a quantized checkpoint in the layout real tools produce: safetensors shards
(``model.safetensors`` or ``model-0000i-of-0000n.safetensors`` with an index) and the
quantization config in ``config.json`` or ``quantize_config.json``."""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from ..errors import InvalidArgumentError
from ..formats.awq import AWQ
from ..formats.base import Format
from ..formats.gptq import GPTQ

__all__ = ["WRITTEN_FORMATS", "config_for", "save_checkpoint", "unwritable"]


def _version() -> str:
    try:
        return importlib.metadata.version("quantcore")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "0"


#: The formats a checkpoint is written in: those whose tools' configs loaders read.
WRITTEN_FORMATS = (GPTQ, AWQ)


def unwritable(fmt: Format) -> str:
    """Why no checkpoint of ``fmt`` can be written ("" when one can)."""
    if isinstance(fmt, WRITTEN_FORMATS):
        return ""
    names = " and ".join(cls.name for cls in WRITTEN_FORMATS)
    return f"quantcore writes {names} checkpoints, not {fmt.slug} (no tool's config describes it)"


def config_for(fmt: Format) -> dict[str, Any]:
    """The quantization config a tool would write for ``fmt``."""
    if isinstance(fmt, GPTQ):
        return {
            "quant_method": "gptq",
            "bits": fmt.bits,
            "group_size": fmt.group_size,
            "desc_act": fmt.desc_act,
            "static_groups": fmt.static_groups,
            "sym": fmt.sym,
            "checkpoint_format": "gptq" if fmt.checkpoint_format == "v1" else "gptq_v2",
            "pack_dtype": str(fmt.pack_dtype).removeprefix("torch."),
            # Who wrote the zero points: readers pick the v1 rule by it (checkpoint/producer.py).
            "meta": {"quantizer": [f"quantcore:{_version()}"]},
        }
    if isinstance(fmt, AWQ):
        return {"quant_method": "awq", "bits": fmt.bits, "group_size": fmt.group_size,
                "zero_point": fmt.zero_point, "version": fmt.layout}
    raise InvalidArgumentError(f"fmt: {unwritable(fmt)}")


def save_checkpoint(
    folder: str | Path,
    fmt: Format,
    linears: Mapping[str, Mapping[str, torch.Tensor]],
    others: Mapping[str, torch.Tensor] | None = None,
    *,
    config_file: Literal["config.json", "quantize_config.json"] = "config.json",
    base_config: Mapping[str, Any] | None = None,
    shards: int = 1,
) -> Path:
    from safetensors.torch import save_file

    qcfg = config_for(fmt)  # before anything is written: a format no config describes leaves no files
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    flat = {f"{prefix}.{leaf}": t.contiguous() for prefix, ts in linears.items() for leaf, t in ts.items()}
    flat.update({k: v.contiguous() for k, v in (others or {}).items()})
    names = sorted(flat)
    if shards == 1:
        save_file(flat, str(folder / "model.safetensors"))
    else:
        weight_map = {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: flat[n] for n in names[i::shards]}
            save_file(part, str(folder / file))
            weight_map.update(dict.fromkeys(part, file))
        # transformers' from_pretrained reads metadata.total_size from the index as well.
        index = {"metadata": {"total_size": sum(t.nbytes for t in flat.values())}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    if config_file == "config.json":
        cfg = dict(base_config or {})
        cfg["quantization_config"] = qcfg
    else:
        cfg = qcfg
    (folder / config_file).write_text(json.dumps(cfg, indent=1))
    return folder
