"""What a plan over pair-interleaved codes depends on, and the tile rounding the
backends' rules share. Each backend keeps its own plans, tables and rule."""

from __future__ import annotations

from dataclasses import dataclass

from .layout import block_k

__all__ = ["Shape", "pow2_at_least"]


@dataclass(frozen=True)
class Shape:
    """What a plan depends on: the call's rows and the weight's K, N and bits (a backend
    whose plans depend on more extends it)."""

    m: int
    k: int
    n: int
    bits: int

    @property
    def blocks(self) -> int:
        """Blocks of the padded K (:mod:`.layout`)."""
        return -(-self.k // block_k(self.bits))


def pow2_at_least(v: int, lo: int, hi: int) -> int:
    """The least power of two at or above ``v``, clamped to ``[lo, hi]``."""
    return max(lo, min(hi, 1 << max(v - 1, 0).bit_length()))
