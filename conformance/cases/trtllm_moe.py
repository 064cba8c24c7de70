"""trtllm_moe conformance cases: the routed GEMM (op ``moe``) and the FFN built from it.

ci: K × N = 128 × 256 over E ∈ {1, 8}, top-k ∈ {1, 2}, T ∈ {1, 7, 64, 512}, group
64 / 128, sym / asym, fp16 / bf16 (scales stored in the activation dtype, as
TensorRT-LLM requires), plus the weighted sum, per-route inputs and the FFN.
full adds the reference 4096 × 28672 with E = 8, top-2 (GPU lanes; docs/formats/trtllm_moe.md).
"""

from __future__ import annotations

import itertools

import torch

from quantcore.formats.trtllm_moe import TRTLLMMoE

from ..case import Case

__all__ = ["trtllm_moe_cases"]

FLOATS = (torch.float16, torch.bfloat16)
ROUTINGS = ((1, 1), (8, 1), (8, 2))  # (E, top-k); top-k <= E
WEIGHT_DIMS = ("E", "K", "N")


def _dims(t: int, e: int, topk: int, k: int, n: int) -> tuple[tuple[str, int], ...]:
    return (("T", t), ("E", e), ("topk", topk), ("K", k), ("N", n))


def _case(fmt: TRTLLMMoE, dims: tuple[tuple[str, int], ...], option: str = "", profile: str = "ci") -> Case:
    options = ((option, True),) if option else ()
    # The FFN draws a second weight set: its own seed keeps its cached weights apart.
    seed = 1 if option == "ffn" else 0
    return Case(fmt, dims, fmt.scale_dtype, seed=seed, options=options, profile=profile, weight_dims=WEIGHT_DIMS)


def trtllm_moe_cases() -> list[Case]:
    cases: list[Case] = []
    for gs, sym, dtype in itertools.product((64, 128), (True, False), FLOATS):
        fmt = TRTLLMMoE(group_size=gs, sym=sym, scale_dtype=dtype)
        for (e, topk), t in itertools.product(ROUTINGS, (1, 7, 64, 512)):
            cases.append(_case(fmt, _dims(t, e, topk, 128, 256)))
        for option in ("weighted", "per_route"):
            cases.append(_case(fmt, _dims(7, 8, 2, 128, 256), option))
        for t in (1, 64):
            cases.append(_case(fmt, _dims(t, 8, 2, 128, 256), "ffn"))
    # The reference shape, on a device lane: every group size and mode once per dtype pair.
    large = [(64, True, torch.float16), (64, False, torch.float16),
             (128, True, torch.bfloat16), (128, False, torch.bfloat16)]
    for gs, sym, dtype in large:
        fmt = TRTLLMMoE(group_size=gs, sym=sym, scale_dtype=dtype)
        for t in (1, 7, 64, 512):
            cases.append(_case(fmt, _dims(t, 8, 2, 4096, 28672), profile="full"))
    return cases
