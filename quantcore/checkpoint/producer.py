"""Who wrote a GPTQ checkpoint, and reading its v1 zero points the way that writer wrote them.

A v1 ``qzeros`` field stores ``z − 1``; writers differ only where z = 0
(:mod:`quantcore.formats.gptq.convert`). The config says who wrote it where the tool
records itself: GPTQModel and AutoGPTQ ≥ 0.8 write ``"meta": {"quantizer": ["gptqmodel:2.1.0"]}``
(a string in older releases), quantcore writes ``"quantcore:<version>"``.

* GPTQModel / AutoGPTQ ≥ 0.8, 2/4/8-bit: their v2 → v1 export subtracts ``0x…1111`` from
  whole lanes, so the lanes are read with the inverse lane arithmetic and become v2;
* quantcore, and GPTQModel at 3 bits (fields shifted one by one): field by field;
* no producer named: field by field, and where a lane holds a zero of 0 below its top
  field — the only lanes on which the writers disagree — one warning says how many, where,
  and what a lane writer would have meant.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import QuantCoreWarning
from ..formats.base import Format
from ..formats.gptq import GPTQ
from ..formats.gptq.convert import ambiguous_v1_lanes, v1_lanes_to_v2

__all__ = ["Producer", "V1Reader", "detect_producer"]

#: Tools whose v1 export is lane arithmetic (GPTQModel's exporter, also in AutoGPTQ's main branch).
LANE_WRITERS = ("gptqmodel", "autogptq")


@dataclass(frozen=True)
class Producer:
    name: str  # "gptqmodel", "autogptq", "quantcore", or "" when the config does not say
    version: str = ""

    def __str__(self) -> str:
        return f"{self.name}:{self.version}" if self.name else "an unnamed tool"


def detect_producer(config: Mapping[str, Any]) -> Producer:
    """The quantizer the config's ``meta.quantizer`` names (the first, if a list)."""
    meta = config.get("meta")
    quantizer = meta.get("quantizer") if isinstance(meta, Mapping) else None
    if isinstance(quantizer, (list, tuple)):
        quantizer = quantizer[0] if quantizer else None
    if not isinstance(quantizer, str) or not quantizer:
        return Producer("")
    name, _, version = quantizer.partition(":")
    return Producer(name.strip().lower().replace("-", "").replace("_", ""), version.strip())


@dataclass
class V1Reader:
    """Reads every linear of one checkpoint; collects what it could not decide, for one
    warning at the end (:meth:`warn`)."""

    fmt: Format
    producer: Producer
    source: str = ""
    ambiguous: dict[str, int] = field(default_factory=dict)
    lanes_seen: int = 0

    @property
    def lane_arithmetic(self) -> bool:
        return (isinstance(self.fmt, GPTQ) and self.fmt.checkpoint_format == "v1"
                and self.producer.name in LANE_WRITERS and self.fmt.geometry.lanes == 1)

    def read(self, layer: str, tensors: dict[str, torch.Tensor]) -> tuple[Format, dict[str, torch.Tensor]]:
        """The layer's format and tensors as the kernels should see them."""
        fmt = self.fmt
        if not isinstance(fmt, GPTQ) or fmt.checkpoint_format != "v1" or "qzeros" not in tensors:
            return fmt, tensors
        if self.lane_arithmetic:
            return v1_lanes_to_v2(fmt, tensors)
        if self.producer.name != "quantcore":
            count = ambiguous_v1_lanes(fmt, tensors["qzeros"])
            self.lanes_seen += tensors["qzeros"].numel() // fmt.geometry.lanes
            if count:
                self.ambiguous[layer] = count
        return fmt, tensors

    def warn(self) -> None:
        if not self.ambiguous:
            return
        total = sum(self.ambiguous.values())
        first = next(iter(self.ambiguous))
        assert isinstance(self.fmt, GPTQ)
        top = self.fmt.maxq
        warnings.warn(
            f"{self.source}: {total} of {self.lanes_seen} v1 qzeros lanes in {len(self.ambiguous)} layers (first: "
            f"{first}.qzeros) hold the field {top} — a zero point of 0 — below their top field, and the config "
            f"names no producer (meta.quantizer). Read field by field, as quantcore writes them. GPTQModel's "
            f"export would have lowered the field above each by one (name it in meta.quantizer, e.g. "
            f"\"gptqmodel:2.0\", to read its lanes); AutoGPTQ <= 0.7 overwrote the fields above with {top}, "
            "which no reader can recover. Converting to gptq_v2 removes the question.",
            QuantCoreWarning, stacklevel=3,
        )
