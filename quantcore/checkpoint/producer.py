"""Who wrote a GPTQ checkpoint, and reading its v1 zero points the way that writer wrote them.

A v1 ``qzeros`` field stores ``z − 1``; writers differ only where z = 0
(:mod:`quantcore.formats.gptq.convert`). The config says who wrote it where the tool
records itself: GPTQModel and AutoGPTQ ≥ 0.8 write ``"meta": {"quantizer": ["gptqmodel:2.1.0"]}``
(a string in older releases), quantcore writes ``"quantcore:<version>"``. The two rules:

* ``"lanes"`` — GPTQModel / AutoGPTQ ≥ 0.8, 2/4/8-bit: their v2 → v1 export subtracts
  ``0x…1111`` from whole lanes, so the lanes are read with the inverse lane arithmetic
  and become v2;
* ``"fields"`` — quantcore, and GPTQModel at 3 bits (fields shifted one by one): field by
  field.

Never a guess: where the config names no producer (transformers' ``GPTQConfig`` writes
``"meta": null``) and a lane holds a zero of 0 below its top field — the only lanes on
which the rules disagree — the checkpoint is refused until the caller names the rule
(``v1_zeros=``). Where no lane is ambiguous both rules read the same numbers, and it loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ..errors import InvalidArgumentError, TensorFormatError
from ..formats.base import Format
from ..formats.gptq import GPTQ
from ..formats.gptq.convert import ambiguous_v1_lanes, v1_lanes_to_v2

__all__ = ["V1_RULES", "Producer", "V1Reader", "V1Rule", "detect_producer"]

#: Tools whose v1 export is lane arithmetic (GPTQModel's exporter, also in AutoGPTQ's main branch).
LANE_WRITERS = ("gptqmodel", "autogptq")
V1Rule = Literal["lanes", "fields"]
V1_RULES: tuple[str, ...] = ("lanes", "fields")


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


def _rule_of(fmt: Format, producer: Producer, v1_zeros: str | None) -> str | None:
    """The rule to read with: the caller's, else the one the producer implies, else None."""
    if v1_zeros is not None:
        if v1_zeros not in V1_RULES:
            raise InvalidArgumentError(f"v1_zeros: expected one of {V1_RULES}, got {v1_zeros!r}")
        if v1_zeros == "lanes" and isinstance(fmt, GPTQ) and fmt.geometry.lanes != 1:
            raise InvalidArgumentError(
                f"v1_zeros: 'lanes' is defined for 2/4/8-bit lanes; {fmt.bits}-bit v1 fields straddle lanes "
                "and every tool writes them field by field (v1_zeros='fields')"
            )
        return v1_zeros
    if producer.name == "quantcore":
        return "fields"
    if producer.name in LANE_WRITERS:
        return "lanes" if not isinstance(fmt, GPTQ) or fmt.geometry.lanes == 1 else "fields"
    return None


@dataclass
class V1Reader:
    """Reads the linears of one checkpoint. With no rule, :meth:`survey` every layer's
    ``qzeros`` first; :meth:`decide` then refuses an ambiguous checkpoint."""

    fmt: Format
    producer: Producer
    source: str = ""
    v1_zeros: str | None = None
    ambiguous: dict[str, int] = field(default_factory=dict)
    lanes_seen: int = 0
    surveyed: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rule = _rule_of(self.fmt, self.producer, self.v1_zeros) if self.applies else None

    @property
    def applies(self) -> bool:
        return isinstance(self.fmt, GPTQ) and self.fmt.checkpoint_format == "v1"

    @property
    def needs_survey(self) -> bool:
        return self.applies and self.rule is None

    def survey(self, layer: str, qzeros: torch.Tensor) -> None:
        """Count the lanes of one layer on which the rules disagree."""
        if not self.needs_survey or layer in self.surveyed:
            return
        self.surveyed.add(layer)
        assert isinstance(self.fmt, GPTQ)
        try:
            count = ambiguous_v1_lanes(self.fmt, qzeros)
        except (ValueError, RuntimeError):
            return  # a misshapen qzeros: the format's validation names it
        self.lanes_seen += qzeros.numel() // self.fmt.geometry.lanes
        if count:
            self.ambiguous[layer] = count

    def decide(self) -> None:
        """Refuse the checkpoint when a surveyed lane is ambiguous; otherwise both rules
        agree and it is read field by field."""
        if not self.ambiguous:
            return
        assert isinstance(self.fmt, GPTQ)
        total = sum(self.ambiguous.values())
        first = next(iter(self.ambiguous))
        raise TensorFormatError(
            f"{self.source}: {first}.qzeros: {total} of {self.lanes_seen} v1 zero-point lanes in "
            f"{len(self.ambiguous)} layer(s) hold the field {self.fmt.maxq} (a zero point of 0) below their top "
            "field, where writers disagree, and the config names no producer (meta.quantizer is missing or null, "
            "as transformers' GPTQConfig writes it); expected the producer's rule: pass v1_zeros='lanes' if "
            "GPTQModel or AutoGPTQ >= 0.8 exported it (transformers' GPTQ path included), v1_zeros='fields' if it "
            "was written field by field (quantcore); AutoGPTQ <= 0.7 overwrote the fields above, which no reader "
            "can recover (re-export as gptq_v2)"
        )

    def read(self, layer: str, tensors: dict[str, torch.Tensor]) -> tuple[Format, dict[str, torch.Tensor]]:
        """The layer's format and tensors as the kernels should see them."""
        fmt = self.fmt
        if not self.applies or "qzeros" not in tensors:
            return fmt, tensors
        if self.rule == "lanes":
            assert isinstance(fmt, GPTQ)
            return v1_lanes_to_v2(fmt, tensors)
        if self.rule is None:
            self.survey(layer, tensors["qzeros"])
            self.decide()
        return fmt, tensors
