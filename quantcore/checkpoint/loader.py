"""Reading a quantized checkpoint folder: config → scheme, shards → per-linear tensors.

Every quantized linear is found by its marker tensor (``<prefix>.qweight`` for GPTQ and
AWQ, ``<prefix>.weight_packed`` for compressed-tensors; :mod:`.scheme`) and gathers the
layout's other tensors under the same prefix; everything else (embeddings, norms,
unquantized heads) is returned untouched in ``others``. Each linear is checked against
the config before it is validated, so a file that disagrees with its config says so in
those terms, and is returned as the kernels take it: GPTQ v1 zero points read by their
writer's rule (:mod:`.producer`), compressed-tensors as GPTQ v2 tensors.
:func:`load_checkpoint` reads every shard at once; :func:`quantcore.load_quantized`
(:mod:`.load`) is the lazy, per-layer path into a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import QuantCoreError, TensorFormatError
from ..formats.base import Format
from .config import read_quant_config, scheme_from_config
from .producer import V1Reader, detect_producer
from .scheme import GPTQ_TENSORS, CheckpointScheme, SingleFormatScheme
from .shards import INDEX, inside, read_index, read_shard, shard_names

__all__ = ["Checkpoint", "load_checkpoint"]

#: The tensors of a GPTQ / AWQ linear (kept under its historical name).
LINEAR_TENSORS = GPTQ_TENSORS


@dataclass
class Checkpoint:
    #: The format of the linears (for a compressed-tensors checkpoint with several
    #: config groups, the first layer's: see :meth:`format_of`).
    format: Format
    #: ``{"model.layers.0.mlp.up_proj": {"qweight": ..., "qzeros": ..., ...}}``
    linears: dict[str, dict[str, torch.Tensor]]
    #: Every tensor that belongs to no quantized linear, by its full name.
    others: dict[str, torch.Tensor] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    config_file: str = ""
    #: Each linear's format, where they differ between layers.
    formats: dict[str, Format] = field(default_factory=dict)

    def format_of(self, name: str) -> Format:
        return self.formats.get(name, self.format)

    def dims(self, name: str) -> dict[str, int]:
        return self.format_of(name).validate(self.linears[name])


def _read_shards(folder: Path, where: dict[str, Path] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of every shard; ``where`` (when given) gets the file of each."""
    weight_map = read_index(folder)
    tensors: dict[str, torch.Tensor] = {}
    for file in shard_names(folder, weight_map):
        shard = inside(folder, file, folder / INDEX)
        if not shard.exists():
            raise TensorFormatError(f"{folder / INDEX}: names shard {file}, which is not in {folder}")
        for name, t in read_shard(shard).items():
            if name in tensors:
                raise TensorFormatError(f"{folder}: tensor {name} appears in more than one shard (again in {shard.name})")
            tensors[name] = t
            if where is not None:
                where[name] = shard
    return tensors


def _split(
    tensors: dict[str, torch.Tensor], scheme: CheckpointScheme
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    linears: dict[str, dict[str, torch.Tensor]] = {p: {} for p in scheme.layers(tensors)}
    owned = set(scheme.leaves) - {"bias"}
    others: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if prefix in linears and leaf in scheme.leaves:
            linears[prefix][leaf] = t
        elif (leaf in owned and leaf != "scales") or (leaf == "scales" and f"{prefix}.qzeros" in tensors):
            raise TensorFormatError(f"{name}: belongs to a quantized linear, but {prefix}.{scheme.marker} is missing")
        else:
            others[name] = t
    return linears, others


def load_checkpoint(folder: str | Path, *, format: Format | None = None, v1_zeros: str | None = None) -> Checkpoint:
    """Read a quantized checkpoint folder. ``format`` overrides the folder's config (a
    GPTQ or AWQ format); ``v1_zeros`` names the rule of GPTQ v1 zero points when the
    config does not name their producer (``"lanes"`` or ``"fields"``, :mod:`.producer`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TensorFormatError(f"{folder}: not a directory")
    config: dict[str, Any] = {}
    source = ""
    if format is None:
        config, source = read_quant_config(folder)
        scheme = scheme_from_config(config, str(folder / source), v1_zeros=v1_zeros)
    else:
        scheme = SingleFormatScheme(format, V1Reader(format, detect_producer(config), source=str(folder),
                                                     v1_zeros=v1_zeros))
    files: dict[str, Path] = {}
    linears, others = _split(_read_shards(folder, files), scheme)
    if not linears:
        raise TensorFormatError(f"{folder}: no quantized linear (no tensor named '<prefix>.{scheme.marker}')")

    def said(prefix: str, exc: QuantCoreError) -> QuantCoreError:
        message = str(exc) if str(exc).startswith(prefix) else f"{prefix}: {exc}"
        return type(exc)(f"{files[f'{prefix}.{scheme.marker}']}: {message}")

    for prefix, tensors in sorted(linears.items()):
        try:
            scheme.check(prefix, tensors)
        except TensorFormatError as exc:
            raise said(prefix, exc) from None
        scheme.survey(prefix, tensors.__getitem__)
    scheme.decide()
    formats: dict[str, Format] = {}
    for prefix, tensors in sorted(linears.items()):
        try:
            formats[prefix], linears[prefix] = scheme.to_kernel(prefix, tensors)
        except QuantCoreError as exc:
            raise said(prefix, exc) from None
    first = formats[min(formats)]
    varied = any(f != first for f in formats.values())
    return Checkpoint(first, linears, others, config, source, formats=formats if varied else {})
