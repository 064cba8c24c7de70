"""What a benchmark is made of: cases (one shape) holding variants (one timed thing each)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from quantcore.timing import Timing

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
    #: Set on a registered kernel called as a ``get_kernel`` caller calls it: the format
    #: (slug) it competes for. Those are the variants the default choice is judged among.
    candidate: str = ""
    #: The kernel keeps a dense copy of the weight (``Kernel.keeps_dense_weight``).
    keeps_dense: bool = False
    #: ``get_kernel`` chooses this kernel by default for the case.
    chosen: bool = False


@dataclass
class BenchCase:
    suite: str
    label: str
    dims: dict[str, int]
    variants: list[Variant] = field(default_factory=list)
    #: Set when a variant was left out (package missing, kernel refused): shown, not hidden.
    skipped: dict[str, str] = field(default_factory=dict)
