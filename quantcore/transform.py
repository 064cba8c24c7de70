"""The Transform interface: a pure function from one tensor layout to another.

Like torchao's layouts, each transform keeps both directions beside each other where it
loses nothing, so a round trip is its test. A transform that cannot be inverted (its
target is an opaque, ISA-specific packing) says so by leaving ``invert`` alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Generic, TypeVar

__all__ = ["Transform"]

Src = TypeVar("Src")
Dst = TypeVar("Dst")


class Transform(ABC, Generic[Src, Dst]):
    name: ClassVar[str]

    @abstractmethod
    def apply(self, src: Src) -> Dst:
        """Deterministic: the same input gives bit-identical output."""

    def invert(self, dst: Dst) -> Src:
        raise NotImplementedError(f"transform {self.name!r} has no inverse")

    @property
    def invertible(self) -> bool:
        return type(self).invert is not Transform.invert
