"""The prepared state every trtllm_moe kernel starts from: the validated stored tensors
on the kernel's device, with the problem dims they imply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from quantcore.errors import KernelInputError
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.kernels.trtllm_moe import ACT_DTYPES
from quantcore.schema import Fields, TensorSpec
from quantcore.tensors import stored_on

__all__ = ["ExpertWeights", "expert_schema", "load_expert_weights"]


@dataclass(frozen=True)
class ExpertWeights:
    qweight: torch.Tensor  # [E, K, N] int8, signed codes
    scales: torch.Tensor  # [E, G, N]
    zeros: torch.Tensor | None  # [E, G, N] or None (symmetric)
    group_size: int

    @property
    def num_experts(self) -> int:
        return self.qweight.shape[0]

    @property
    def k(self) -> int:
        return self.qweight.shape[1]

    @property
    def n(self) -> int:
        return self.qweight.shape[2]


def expert_schema(cls: type, fmt: TRTLLMMoE, dims: Mapping[str, int], codes: str) -> Fields:
    """The prepared schema (:mod:`quantcore.schema`) of experts kept as stored, the int8
    codes ``[E, K, N]`` (in field ``codes``, possibly re-laid out in place) with their
    group scales and, when asymmetric, zeros."""
    e, k, n = dims["E"], dims["K"], dims["N"]
    group = TensorSpec((e, fmt.num_groups(k), n), (fmt.scale_dtype,))
    return Fields(cls, **{codes: TensorSpec((e, k, n), (torch.int8,))}, scales=group,
                  zeros=None if fmt.sym else group, group_size=fmt.group_size)


def load_expert_weights(
    fmt: TRTLLMMoE, tensors: Mapping[str, torch.Tensor], device: torch.device, dtype: torch.dtype | None
) -> ExpertWeights:
    if dtype is not None and dtype not in ACT_DTYPES:
        raise KernelInputError(f"dtype: expected float16 or bfloat16 activations, got {dtype}")
    tensors = stored_on(tensors, device, where="trtllm_moe prepare")
    fmt.validate(tensors)
    return ExpertWeights(
        qweight=tensors["qweight"].contiguous(),
        scales=tensors["scales"].contiguous(),
        zeros=tensors["zeros"].contiguous() if "zeros" in tensors else None,
        group_size=fmt.group_size,
    )
