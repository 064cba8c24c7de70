"""What one call of the kernel runs: its tile, pipeline depth and K split.

Plain values shared by the rule (``configs.py``) and the shipped tables (``tuned.py``).
Every plan runs on the one prepared layout: a plan changes how many 64-row tiles a CTA
takes (``wg``), how many activation rows (``bm``), how many blocks TMA keeps in flight
(``stages``) and how many programs split K (``split``) — never the weight's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Plan"]

#: wgmma's N, the activation rows of a tile: 8…256 in steps of 8 (powers of two here).
BM_CHOICES = (8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Plan:
    #: Consumer warpgroups per CTA, each 64 weight rows (1 or 2).
    wg: int
    #: Activation rows per tile (wgmma's N).
    bm: int
    #: Shared-memory ring depth: blocks TMA fetches ahead.
    stages: int
    #: Programs splitting K (1: none).
    split: int = 1
    #: Blocks issued between two waits for every wgmma group (1 or 2).
    per_wait: int = 1
    #: Leave each block's wgmma groups in flight while the next block is dequantized (a
    #: wait per block retires the one before); excludes ``per_wait`` 2.
    in_flight: bool = False

    def __post_init__(self) -> None:
        if (self.wg not in (1, 2) or self.bm not in BM_CHOICES or not 2 <= self.stages <= 12 or self.split < 1
                or self.per_wait not in (1, 2) or (self.in_flight and self.per_wait != 1)):
            raise ValueError(f"hopper_wgmma plan out of range: {self}")

    @property
    def num_warps(self) -> int:
        return 4 * self.wg

    def stage_bytes(self, bits: int, scale_bytes: int, sub_rows: int, zeros: bool) -> int:
        """Shared memory one stage of the ring takes (rows of scales and zero points in
        slots of at least 128 bytes, as TMA writes them)."""
        bk = 512 // bits
        row = max(128, 64 * self.wg * scale_bytes) + (max(128, 64 * self.wg) if zeros else 0)
        return self.wg * 4096 + self.bm * bk * 2 + sub_rows * row
