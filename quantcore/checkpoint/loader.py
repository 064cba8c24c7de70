"""Reading a quantized checkpoint folder: config → format, shards → per-linear tensors.

Every quantized linear is found by its ``<prefix>.qweight`` and gathers the format's
other tensors under the same prefix; everything else (embeddings, norms, unquantized
heads) is returned untouched in ``others``. Each linear is checked against the config
before it is validated, so a file that disagrees with its config says so in those terms.
GPTQ v1 zero points are read as the config's producer wrote them (:mod:`.producer`).
:func:`load_checkpoint` reads every shard at once; :func:`quantcore.load_quantized`
(:mod:`.load`) is the lazy, per-layer path into a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import TensorFormatError
from ..formats.awq import AWQ
from ..formats.base import Format
from ..formats.gptq import GPTQ
from .config import format_from_config, read_quant_config
from .producer import V1Reader, detect_producer

__all__ = ["Checkpoint", "load_checkpoint"]

LINEAR_TENSORS = ("qweight", "qzeros", "scales", "g_idx", "bias")


@dataclass
class Checkpoint:
    format: Format
    #: ``{"model.layers.0.mlp.up_proj": {"qweight": ..., "qzeros": ..., ...}}``
    linears: dict[str, dict[str, torch.Tensor]]
    #: Every tensor that belongs to no quantized linear, by its full name.
    others: dict[str, torch.Tensor] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    config_file: str = ""

    def dims(self, name: str) -> dict[str, int]:
        return self.format.validate(self.linears[name])


def _read_shards(folder: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("reading checkpoints needs safetensors: pip install 'quantcore[io]'") from None
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise TensorFormatError(f"{folder}: no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        for name, t in load_file(str(shard)).items():
            if name in tensors:
                raise TensorFormatError(f"{folder}: tensor {name} appears in more than one shard (again in {shard.name})")
            tensors[name] = t
    return tensors


def _split(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    prefixes = {name[: -len(".qweight")] for name in tensors if name.endswith(".qweight")}
    linears: dict[str, dict[str, torch.Tensor]] = {p: {} for p in prefixes}
    others: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if prefix in linears and leaf in LINEAR_TENSORS:
            linears[prefix][leaf] = t
        elif leaf in ("qzeros", "g_idx") or (leaf == "scales" and f"{prefix}.qzeros" in tensors):
            raise TensorFormatError(f"{name}: belongs to a quantized linear, but {prefix}.qweight is missing")
        else:
            others[name] = t
    return linears, others


def _implied(what: str, expected: object, prefix: str, detail: str) -> TensorFormatError:
    return TensorFormatError(f"{prefix}: the config says {what}={expected}, but {detail}")


def _check_against_config(fmt: Format, prefix: str, t: dict[str, torch.Tensor]) -> None:
    """Config/tensor disagreements, said in the config's terms (bits, group_size)."""
    qweight, scales = t.get("qweight"), t.get("scales")
    if qweight is None or scales is None or qweight.dim() != 2 or scales.dim() != 2:
        return  # validate() names what is missing or misshapen
    if isinstance(fmt, GPTQ) and "g_idx" in t:
        in_features = t["g_idx"].numel()
        lanes_bits = qweight.shape[0] * torch.iinfo(qweight.dtype).bits
        if lanes_bits != in_features * fmt.bits:
            raise _implied(
                "bits", fmt.bits, prefix,
                f"{prefix}.qweight has {qweight.shape[0]} rows of {qweight.dtype} for {in_features} inputs "
                f"({prefix}.g_idx), i.e. {lanes_bits / in_features:g} bits per input",
            )
    elif isinstance(fmt, AWQ):
        in_features = qweight.shape[0]
        if qweight.shape[1] * 32 != scales.shape[1] * fmt.bits:
            raise _implied(
                "bits", fmt.bits, prefix,
                f"{prefix}.qweight packs {scales.shape[1]} outputs ({prefix}.scales) into {qweight.shape[1]} "
                f"int32 lanes, i.e. {qweight.shape[1] * 32 / scales.shape[1]:g} bits per output",
            )
    else:
        return
    gs = getattr(fmt, "group_size", -1)
    groups = scales.shape[0]
    expected = 1 if gs == -1 else in_features // gs if in_features % gs == 0 else None
    if expected is None:
        raise _implied("group_size", gs, prefix, f"it does not divide in_features={in_features}")
    if groups != expected:
        raise _implied(
            "group_size", gs, prefix,
            f"{prefix}.scales has {groups} groups for {in_features} inputs (group_size {in_features / groups:g})",
        )


def load_checkpoint(folder: str | Path, *, format: Format | None = None) -> Checkpoint:
    """Read a quantized checkpoint folder. ``format`` overrides the folder's config."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TensorFormatError(f"{folder}: not a directory")
    config: dict[str, Any] = {}
    source = ""
    if format is None:
        config, source = read_quant_config(folder)
        format = format_from_config(config, source)
    linears, others = _split(_read_shards(folder))
    if not linears:
        raise TensorFormatError(f"{folder}: no quantized linear (no tensor named '<prefix>.qweight')")
    reader = V1Reader(format, detect_producer(config), source=str(folder))
    read_as = format
    for prefix, tensors in sorted(linears.items()):
        _check_against_config(format, prefix, tensors)
        try:
            format.validate(tensors)
        except TensorFormatError as exc:
            raise TensorFormatError(f"{prefix}: {exc}") from None
        read_as, linears[prefix] = reader.read(prefix, tensors)
    reader.warn()
    return Checkpoint(read_as, linears, others, config, source)

