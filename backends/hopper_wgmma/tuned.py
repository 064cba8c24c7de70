"""Plans measured per card (``benchmarks/probes/hopper_wgmma_sweep.py``: the fastest of
its candidates, CUDA-graph replays, bf16, GPTQ g128), keyed by card and by
``(bits, K, N, M)``."""

from __future__ import annotations

from quantcore.probe.card import CardKey

from .plans import Plan

__all__ = ["TABLES"]

TABLES: dict[CardKey, dict[tuple[int, int, int, int], Plan]] = {}
