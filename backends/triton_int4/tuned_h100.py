"""Plans measured on an NVIDIA H100 80GB HBM3, keyed by its card features (:data:`CARD`; the fastest of ``tools/probes/triton_int4_tiles.py``'s candidates,
CUDA-graph replays, bf16 activations, GPTQ g128: ``benchmarks/results/probes/
triton_int4_sweep-nvidia-h100-80gb-hbm3.json``), keyed by ``(bits, close, K, N, M)``.
``close`` is the slices per scale group (``launch.close_slices``): 4 at 4 bits and 2 at
8 bits for groups of 128 or more (g128, g256, −1, act-order g128). The µs are those of
the sweep; ``configs.plan_for`` says how M between the measured ones is served."""

from __future__ import annotations

from quantcore.probe.card_tables import H100_SXM

from .plans import MmaConfig, Plan

__all__ = ["CARD", "PLANS"]

CARD = H100_SXM

# MmaConfig(block_n, block_m, split_k, num_warps, num_stages, operand, block_b)
PLANS: dict[tuple[int, int, int, int, int], Plan] = {
    (4, 4, 4096, 4096, 1): Plan("mma", mma=MmaConfig(64, 16, 10, 4, 4, 1, 1)),  # 8.7 µs
    (4, 4, 4096, 4096, 4): Plan("mma", mma=MmaConfig(64, 16, 10, 4, 4, 1, 1)),  # 9.0 µs
    (4, 4, 4096, 4096, 16): Plan("mma", mma=MmaConfig(64, 16, 5, 4, 3, 1, 2)),  # 9.7 µs
    (4, 4, 4096, 4096, 32): Plan("mma", mma=MmaConfig(64, 32, 5, 4, 3, 1, 2)),  # 11.0 µs
    (4, 4, 4096, 4096, 64): Plan("mma", mma=MmaConfig(64, 64, 5, 4, 3, 1, 2)),  # 15.1 µs
    (4, 4, 4096, 4096, 128): Plan("mma", mma=MmaConfig(64, 128, 5, 4, 3, 1, 1)),  # 29.2 µs
    (4, 4, 4096, 4096, 512): Plan("mma", mma=MmaConfig(128, 128, 1, 8, 3, 1, 1)),  # 39.1 µs
    (4, 4, 4096, 4096, 2048): Plan("dequant"),  # 102.7 µs
    (4, 4, 4096, 14336, 1): Plan("mma", mma=MmaConfig(64, 16, 2, 4, 3, 1, 2)),  # 18.3 µs
    (4, 4, 4096, 14336, 4): Plan("mma", mma=MmaConfig(64, 16, 2, 4, 3, 1, 2)),  # 18.5 µs
    (4, 4, 4096, 14336, 16): Plan("mma", mma=MmaConfig(64, 16, 2, 4, 3, 1, 2)),  # 19.8 µs
    (4, 4, 4096, 14336, 32): Plan("mma", mma=MmaConfig(64, 32, 2, 4, 3, 1, 1)),  # 24.9 µs
    (4, 4, 4096, 14336, 64): Plan("mma", mma=MmaConfig(64, 64, 2, 4, 3, 1, 1)),  # 36.1 µs
    (4, 4, 4096, 14336, 128): Plan("mma", mma=MmaConfig(64, 128, 2, 4, 3, 1, 1)),  # 53.1 µs
    (4, 4, 4096, 14336, 512): Plan("mma", mma=MmaConfig(128, 128, 1, 8, 3, 2, 1)),  # 121.8 µs
    (4, 4, 4096, 14336, 2048): Plan("dequant"),  # 406.0 µs
    (4, 4, 14336, 4096, 1): Plan("mma", mma=MmaConfig(128, 16, 18, 4, 3, 1, 1)),  # 18.9 µs
    (4, 4, 14336, 4096, 4): Plan("mma", mma=MmaConfig(64, 16, 10, 4, 4, 1, 1)),  # 20.1 µs
    (4, 4, 14336, 4096, 16): Plan("mma", mma=MmaConfig(64, 16, 10, 4, 4, 1, 1)),  # 21.8 µs
    (4, 4, 14336, 4096, 32): Plan("mma", mma=MmaConfig(64, 32, 5, 4, 3, 1, 2)),  # 25.7 µs
    (4, 4, 14336, 4096, 64): Plan("mma", mma=MmaConfig(64, 64, 5, 4, 3, 1, 2)),  # 44.6 µs
    (4, 4, 14336, 4096, 128): Plan("mma", mma=MmaConfig(128, 128, 9, 8, 3, 1, 2)),  # 60.5 µs
    (4, 4, 14336, 4096, 512): Plan("mma", mma=MmaConfig(128, 128, 1, 8, 3, 1, 1)),  # 131.0 µs
    (4, 4, 14336, 4096, 2048): Plan("dequant"),  # 391.1 µs
    (8, 2, 4096, 4096, 1): Plan("mma", mma=MmaConfig(64, 16, 10, 4, 3, 1, 2)),  # 11.1 µs
    (8, 2, 4096, 4096, 16): Plan("mma", mma=MmaConfig(64, 16, 10, 4, 3, 1, 2)),  # 12.2 µs
    (8, 2, 4096, 4096, 128): Plan("mma", mma=MmaConfig(64, 128, 5, 4, 3, 1, 1)),  # 32.2 µs
    (8, 2, 4096, 14336, 1): Plan("mma", mma=MmaConfig(64, 16, 2, 4, 3, 1, 2)),  # 28.6 µs
    (8, 2, 4096, 14336, 16): Plan("mma", mma=MmaConfig(64, 16, 2, 4, 3, 1, 2)),  # 29.8 µs
    (8, 2, 4096, 14336, 128): Plan("mma", mma=MmaConfig(64, 128, 2, 4, 3, 1, 1)),  # 69.2 µs
    (8, 2, 14336, 4096, 1): Plan("mma", mma=MmaConfig(64, 16, 5, 4, 3, 1, 2)),  # 29.1 µs
    (8, 2, 14336, 4096, 16): Plan("mma", mma=MmaConfig(64, 16, 10, 4, 3, 1, 2)),  # 31.1 µs
    (8, 2, 14336, 4096, 128): Plan("mma", mma=MmaConfig(64, 128, 5, 4, 3, 1, 1)),  # 82.2 µs
}
