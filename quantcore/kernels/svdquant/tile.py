"""A tile of the fused SVDQuant pre-GEMM kernel: everything that changes its compiled
code or its grid, and the stream-K geometry it gives a launch. Shared by the kernel
(triton_kernel.py), its launcher (triton_launch.py) and the shipped table (configs.py)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_TREE", "Tile", "launch_geometry", "rank_block"]

#: The E2M1 tree the compiled NVFP4 kernel uses unless a tile says otherwise (see
#: :func:`.triton_source.e2m1_code`).
DEFAULT_TREE = 1


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    num_warps: int = 4
    num_stages: int = 3
    #: programs launched (stream-K); 0: ``per_sm`` per SM on a GPU, one per row tile otherwise
    grid: int = 0
    #: the E2M1 comparison tree (NVFP4, compiled): 0 predicates, 1 float fmas
    tree: int = DEFAULT_TREE
    #: a register cap per thread (CUDA; None: the compiler's choice): 168 lets three
    #: 4-warp programs share an SM, 128 four, at the price of a few spilled bytes
    maxnreg: int | None = None
    #: programs per SM when ``grid`` is 0
    per_sm: int = 2
    #: one software-pipelined loop over a program's steps, row tiles included (the loads
    #: of the next steps stay in flight across a row tile's end); False: a loop per row tile
    flat: bool = False
    #: load the next step's ``1/smooth`` a step ahead (its latency off the step's path)
    prefetch: bool = False
    #: LoRA partial slots a shared row tile's last program loads per round trip (1, 2, 4, 8)
    red: int = 1

    def describe(self) -> str:
        """Every field, in words: what a bench row or a log line names the tile by."""
        programs = f"grid {self.grid}" if self.grid else f"{self.per_sm} programs/SM"
        cap = f"maxnreg {self.maxnreg}" if self.maxnreg else "no register cap"
        plan = "".join(word for on, word in ((self.flat, ", flat"), (self.prefetch, ", prefetch")) if on)
        red = f", {self.red} slots a load" if self.red != 1 else ""
        return (f"bm {self.bm}, bn {self.bn}, {self.num_warps} warps, {self.num_stages} stages, {programs}, "
                f"tree {self.tree}, {cap}{plan}{red}")


def rank_block(r: int) -> int:
    """The accumulator's width: R rounded up to a power of two, at least 16 (tl.dot)."""
    return max(16, 1 << max(0, (r - 1).bit_length()))


def launch_geometry(tile: Tile, m_pad: int, n: int, sms: int) -> tuple[int, int, int]:
    """``(programs, row tiles, partial slots per row tile)`` of a launch."""
    row_tiles = m_pad // tile.bm
    steps = row_tiles * -(-n // tile.bn)
    programs = max(1, min(steps, tile.grid or tile.per_sm * sms))
    # a row tile's steps are shared by at most ⌈programs / row tiles⌉ + 1 programs
    return programs, row_tiles, -(-programs // row_tiles) + 1
