"""The plan of the ``turboquant_cutile`` kernel: the path per batch size and the tile sizes
(no imports: the kernel's cost reads the crossover where cuda.tile is not installed).

* M = 1 — the GEMV, ``GEMV_ROWS`` weight rows a block;
* M < ``DEQUANT_FROM_M`` — the matrix-unit kernel, the weight looked up tile by tile,
  where its tiles fill the GPU (``GEMM_MIN_BLOCKS_PER_SM``: it has no split over K);
* else every pass dequantized into one scratch and one cuBLAS GEMM of depth P·K.

Measured on an H200 (``benchmarks/results/probes/turboquant_cutile_paths-nvidia-h200.json``,
``tools/probes/turboquant_cutile_paths.py``; CUDA-graph replays): of the tiles that
compile for sm_90 without register spills, the fastest. Read at call time, so that the
probe can try others.
"""

from __future__ import annotations

__all__ = ["DEQUANT_FROM_M", "DEQUANT_ROWS", "GEMM_MIN_BLOCKS_PER_SM", "GEMM_OCCUPANCY", "GEMM_ROWS",
           "GEMM_STEP_BYTES", "GEMV_OCCUPANCY", "GEMV_ROWS", "dense", "gemm_tiles"]

GEMV_ROWS = 8
#: Blocks an SM should hold (cuTile's ``occupancy`` hint), None for the compiler's choice.
#: Left to itself, tileiras gives the GEMV one block an SM; four hide the latency of the
#: codebook gathers (H200, 4096 × 14336: 169 → 81 µs at 8 rows).
GEMV_OCCUPANCY: int | None = 4
GEMM_OCCUPANCY: int | None = 2
GEMM_ROWS = 64
GEMM_STEP_BYTES = 32
#: Weight rows a dequantization block writes (one group of each).
DEQUANT_ROWS = 64
#: The batch from which the passes go through dequantization and one cuBLAS GEMM.
DEQUANT_FROM_M = 64
#: Below that, the matrix-unit kernel's tiles per SM under which dequantization and cuBLAS
#: are faster all the same (H200, M = 16: 4096 × 14336 has 1.7 tiles an SM, gemm 138 µs
#: against 159; 14336 × 4096 has 0.5, gemm 291 µs against 162).
GEMM_MIN_BLOCKS_PER_SM = 1.0


def gemm_tiles(m: int, half: int) -> tuple[int, int, int]:
    """(TN, TM, TK): weight rows, activation rows (16 for decode-sized batches, else 64:
    two shapes, so few compilations) and bytes of a group per step."""
    return GEMM_ROWS, 16 if m <= 16 else 64, min(GEMM_STEP_BYTES, half)


def dense(m: int, n: int, sms: int) -> bool:
    """Whether ``m`` rows against ``n`` weight rows take dequantization and cuBLAS."""
    if m >= DEQUANT_FROM_M:
        return True
    if m == 1:
        return False
    tn, tm, _ = gemm_tiles(m, 64)
    return -(-n // tn) * -(-m // tm) < GEMM_MIN_BLOCKS_PER_SM * sms
