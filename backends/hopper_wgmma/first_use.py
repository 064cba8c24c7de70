"""Plans measured on the first call of a shape, on a card whose own table lacks it, kept
in this machine's cache.

The shipped tables (``tuned-<card>.json``) hold the H100's and the H200's plans; another
sm_90 card (an H100 PCIe, an H20, an H800) would run the nearest card's plans, tuned for
another SM count and bandwidth. On such a card the first call of a (bits, K, N, M bucket)
times a few plans on the call's own weight — the nearest card's, the rule's, and each of
them with K split twice as far and half as far — as CUDA-graph replays, and keeps the
fastest in ``$QUANTCORE_CACHE/hopper_wgmma/<card>.json`` (default
``~/.cache/quantcore``): a second process reads it and times nothing. Every
plan kind timed here is one the shipped tables already run (waited and in-flight wgmma
plans; no Triton plan), so the check that proved those kinds proves these.

``QUANTCORE_HOPPER_TUNE``: ``auto`` (default: layers of 8 MiB or more on a card without a
table of its own; a first call of such a layer then takes seconds, compiling the plans it
times), ``off`` (never: the nearest table or the rule), ``always`` (every shape on every
card: how the measurement itself is checked on an H100 or H200). Nothing is timed while
a CUDA graph is being captured: that call takes the table's plan and caches nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from quantcore.errors import InvalidArgumentError
from quantcore.files import read_json, replace_json
from quantcore.kernels.gptq_pairs.plans import Shape, pow2_at_least
from quantcore.measured import cache_dir
from quantcore.probe.card import CardKey

from .configs import default_plan, has_table
from .plans import AnyPlan, Plan, plan_from_dict

__all__ = ["TUNE_ENV", "TUNE_MODES", "PlanCache", "candidates", "first_use_plan", "time_plans", "tune_mode"]

log = logging.getLogger("quantcore")

TUNE_ENV = "QUANTCORE_HOPPER_TUNE"
TUNE_MODES = ("auto", "off", "always")
SCHEMA = "quantcore.hopper-plans/1"
#: The smallest weight ``auto`` times plans for (a 4096 × 4096 layer at 4 bits is 8 MiB).
MIN_WEIGHT_BYTES = 8 << 20
#: Interleaved timing rounds per plan (the median is kept).
ROUNDS = 3
#: More than the L2 of any sm_90 card (50 MB on the H100 and H200).
L2_FLUSH_BYTES = 96 << 20
LOCK_TIMEOUT_S = 60.0
MAX_CACHE_BYTES = 4 << 20


def tune_mode() -> str:
    mode = os.environ.get(TUNE_ENV, "auto").strip().lower() or "auto"
    if mode not in TUNE_MODES:
        raise InvalidArgumentError(f"{TUNE_ENV}: expected one of {list(TUNE_MODES)}, got {mode!r}")
    return mode


def unknown_card_layer(shape: Shape, card: CardKey) -> bool:
    """What ``auto`` times: a model-sized layer (:data:`MIN_WEIGHT_BYTES` or more) on a card
    without a table of its own. A shipped card's unmeasured shapes keep the nearest table's
    plan or the rule, so no first call there times anything; small layers, where a plan
    moves microseconds, are not worth a first call's seconds."""
    return not has_table(card) and shape.k * shape.n * shape.bits // 8 >= MIN_WEIGHT_BYTES


def bucket(shape: Shape) -> tuple[int, int, int, int]:
    """The cache key of a call: (bits, K, N, M rounded up to a power of two)."""
    return shape.bits, shape.k, shape.n, pow2_at_least(shape.m, 1, 1 << 20)


def candidates(shape: Shape, card: CardKey, table_plan: AnyPlan) -> list[Plan]:
    """The plans timed: the table's (where it is a wgmma plan), the rule's, and each with K
    split twice as far and half as far (within the weight's blocks), without repeats."""
    out: list[Plan] = []
    for base in (table_plan, default_plan(shape, card)):
        if not isinstance(base, Plan):
            continue
        for split in (base.split, base.split * 2, base.split // 2):
            plan = dataclasses.replace(base, split=max(1, min(split, shape.blocks)))
            if plan not in out:
                out.append(plan)
    return out


def time_plans(plans: Sequence[Plan], run: Callable[[Plan], Any], device: torch.device) -> list[float]:
    """Seconds per call of each plan on the GPU: CUDA-graph replays (the host's launch cost
    left out, as decode runs), each call after a write of more than L2 holds (so the weight
    comes from memory, as it does in a model), that write's own time subtracted; the plans
    interleaved over rounds (quantcore/timing.py)."""
    from quantcore.timing import time_interleaved

    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)

    def call(plan: Plan | None) -> Callable[[int], object]:
        def fn(i: int) -> None:
            flush.zero_()
            if plan is not None:
                run(plan)
        return fn

    timings = time_interleaved([call(None), *map(call, plans)], str(device), rounds=ROUNDS, graph=True)
    alone = timings[0].median_s
    return [max(t.median_s - alone, 0.0) for t in timings[1:]]


class PlanCache:
    """``$QUANTCORE_CACHE/hopper_wgmma/<card>.json``: the plan measured per bucket, read
    once per change of the file; a malformed file is ignored (one warning) and rewritten."""

    def __init__(self, card: CardKey) -> None:
        self.card = card
        self.path = cache_dir() / "hopper_wgmma" / f"{card.slug}.json"
        self._lock = threading.Lock()
        self._seen: tuple[tuple[int, int], dict[str, Plan]] | None = None
        self._warned = False

    def _entries(self, path: Path) -> dict[str, Plan]:
        try:
            data = read_json(path, limit=MAX_CACHE_BYTES, error=InvalidArgumentError)
            if data.get("schema") != SCHEMA or data.get("card") != self.card.slug:
                raise InvalidArgumentError(f"{path}: not a {SCHEMA} file of {self.card.slug}")
            plans = {k: plan_from_dict(v["plan"]) for k, v in data["entries"].items()}
            if not all(isinstance(p, Plan) for p in plans.values()):
                raise InvalidArgumentError(f"{path}: an entry is not a wgmma plan")
            return plans  # type: ignore[return-value]
        except (InvalidArgumentError, AttributeError, KeyError, TypeError, ValueError) as exc:
            if not self._warned:
                self._warned = True
                log.warning("ignoring %s: %s", path, exc)
            return {}

    def get(self, key: tuple[int, int, int, int]) -> Plan | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        signature = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if self._seen is None or self._seen[0] != signature:
                self._seen = (signature, self._entries(self.path))
            return self._seen[1].get(_name(key))

    def put(self, key: tuple[int, int, int, int], plan: Plan, seconds: dict[str, float]) -> None:
        """Add one measurement; a cache that cannot be written is logged, never raised."""

        def merged(path: Path) -> dict[str, Any]:
            kept = self._entries(path) if path.exists() else {}
            entries = {k: {"plan": dataclasses.asdict(p)} for k, p in kept.items()}
            entries[_name(key)] = {"plan": dataclasses.asdict(plan), "seconds": seconds}
            return {"schema": SCHEMA, "card": self.card.slug, "entries": dict(sorted(entries.items()))}

        try:
            replace_json(self.path, merged, lock_timeout_s=LOCK_TIMEOUT_S)
        except Exception as exc:  # the cache is an optimisation: never fail the call
            log.warning("could not write %s: %s: %s", self.path, type(exc).__name__, exc)


def _name(key: tuple[int, int, int, int]) -> str:
    return "bits{}-k{}-n{}-m{}".format(*key)


_caches: dict[CardKey, PlanCache] = {}


def _cache(card: CardKey) -> PlanCache:
    hit = _caches.get(card)
    if hit is None or hit.path.parent.parent != cache_dir():
        hit = _caches[card] = PlanCache(card)
    return hit


def first_use_plan(shape: Shape, card: CardKey, table_plan: AnyPlan, run: Callable[[Plan], Any],
                   device: torch.device, *,
                   timer: Callable[[Sequence[Plan], Callable[[Plan], Any], torch.device], list[float]] = time_plans,
                   ) -> AnyPlan:
    """The plan a call of ``shape`` takes on ``card``: ``table_plan`` where the mode or the
    card's own table says so, or while a CUDA graph is captured; else the cached
    measurement, or a new one (``run(plan)`` launches the call with ``plan``)."""
    mode = tune_mode()
    if mode == "off" or (mode == "auto" and not unknown_card_layer(shape, card)):
        return table_plan
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return table_plan
    cache = _cache(card)
    key = bucket(shape)
    hit = cache.get(key)
    if hit is not None:
        return hit
    plans = candidates(shape, card, table_plan)
    if len(plans) < 2:
        return table_plan
    times = timer(plans, run, device)
    best = plans[min(range(len(plans)), key=times.__getitem__)]
    cache.put(key, best, {_label(p): t for p, t in zip(plans, times, strict=True)})
    return best


def _label(plan: Plan) -> str:
    return f"wg{plan.wg}-bm{plan.bm}-s{plan.stages}-k{plan.split}-w{plan.per_wait}{'-f' if plan.in_flight else ''}"
