"""What a benchmark is made of: cases (one shape) holding variants (one timed thing each)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .timing import Timing

__all__ = ["BenchCase", "Variant"]

Role = Literal["kernel", "peer"]


@dataclass
class Variant:
    """One timed callable. ``fn(i)`` runs once on rotating input set ``i % sets``, so
    the inputs in flight exceed the cache and memory traffic is what gets measured."""

    name: str
    role: Role
    fn: Callable[[int], object]
    #: The fewest bytes the call must move: each input read once, each output written once.
    bytes: int
    flops: int
    sets: int = 1
    note: str = ""
    #: Already timed elsewhere (in the ranks of a tensor-parallel group): the runner
    #: reports it as is and does not call ``fn``.
    measured: Timing | None = None


@dataclass
class BenchCase:
    suite: str
    label: str
    dims: dict[str, int]
    variants: list[Variant] = field(default_factory=list)
    #: Set when a variant was left out (package missing, kernel refused): shown, not hidden.
    skipped: dict[str, str] = field(default_factory=dict)
