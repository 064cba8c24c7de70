"""The oracle of each op, by name: what the kernel fuzz, the transform fuzz and the thread
tests ask for. An op without one is fuzzed up to ``prepare``."""

from __future__ import annotations

from .act_quant_lora_oracle import ActQuantLoraOracle
from .oracles import LinearOracle, MoEOracle, OpOracle

__all__ = ["ORACLES", "oracle_for"]

ORACLES: dict[str, OpOracle] = {o.op: o for o in (LinearOracle(), MoEOracle(), ActQuantLoraOracle())}


def oracle_for(op: str) -> OpOracle | None:
    return ORACLES.get(op)
