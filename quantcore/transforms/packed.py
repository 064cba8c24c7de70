"""Prepared state shared by the int4pack kernels (torch's CPU, XPU and CUDA ops).

Each holds a packed weight in its op's layout, per-group float metadata (scales, or
scales with offsets) that the op wants in the activation's dtype, the activation
permutation of act-order checkpoints and the bias. The call path is the same for all:
check the activation, permute it, run the op, add the bias, restore the batch shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..cost import Cost, grouped_weight_bytes, linear_cost
from ..dtypes import dtype_name
from ..errors import KernelInputError
from ..formats.gptq import GPTQ
from ..kernel import Support
from ..problem import Problem
from ..schema import DictOf, Fields, Maybe, OneOf, TensorSpec
from ..tensors import check_activation

__all__ = ["PackedLinear", "expect_prepared", "int4pack_cost", "int4pack_supports", "packed_schema"]

#: The alignment, in bytes, the ops' vector loads need of the activation.
VECTOR_ALIGN = 16
#: Dtypes a checkpoint's bias is kept in.
BIAS_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _misaligned(t: torch.Tensor) -> bool:
    """Whether ``t`` starts off a :data:`VECTOR_ALIGN` boundary. Not asked while
    ``torch.compile`` traces the call (an address has no value there): a graph compiled for
    an aligned GPU input copies one that arrives misaligned before it runs (Inductor's
    ``get_input_idxs_to_check``)."""
    return not torch.compiler.is_compiling() and t.data_ptr() % VECTOR_ALIGN != 0


@dataclass(kw_only=True)
class PackedLinear:
    weight: torch.Tensor
    group_size: int
    ret_idx: torch.Tensor | None
    bias: torch.Tensor | None
    in_features: int
    out_features: int
    #: The metadata (and bias) cast per activation dtype, filled on first use.
    by_dtype: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict, repr=False)

    #: The subclass field holding the per-group float metadata.
    META: ClassVar[str]

    def for_dtype(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        hit = self.by_dtype.get(dtype)
        if hit is None:
            bias = self.bias.to(dtype) if self.bias is not None else None
            meta = getattr(self, self.META).to(dtype).contiguous()
            if _misaligned(meta):  # a loaded state's view at an odd offset
                meta = meta.clone()
            hit = self.by_dtype[dtype] = (meta, bias)
        return hit

    def ready_for(self, dtype: torch.dtype | None, act_dtypes: tuple[torch.dtype, ...]) -> PackedLinear:
        """Cast the metadata for ``dtype`` now (``prepare(dtype=...)``), or refuse it."""
        if dtype is not None:
            if dtype not in act_dtypes:
                names = ", ".join(dtype_name(d) for d in act_dtypes)
                raise KernelInputError(f"dtype: expected {names}, got {dtype}")
            self.for_dtype(dtype)
        return self

    def run(
        self, x: torch.Tensor, mm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], act_dtypes: tuple[torch.dtype, ...]
    ) -> torch.Tensor:
        """``mm(x2d, metadata)`` on the permuted activation, plus bias, in x's batch shape."""
        k = self.in_features
        check_activation(x, k=k, dtypes=act_dtypes, device=self.weight.device)
        meta, bias = self.for_dtype(x.dtype)
        x2 = x.reshape(-1, k)
        if x2.shape[0] == 0:  # never launch on no rows: tinygemm's CUDA launch rejects a zero grid
            return x.new_empty(*x.shape[:-1], self.out_features)
        x2 = x2.index_select(1, self.ret_idx) if self.ret_idx is not None else x2.contiguous()
        if _misaligned(x2):
            # A view at an odd storage offset: tinygemm's CUDA kernel loads x in 16-byte
            # vectors and faulted on it (misaligned address, which poisons the context).
            x2 = x2.clone()
        y = mm(x2, meta)
        if bias is not None:
            y.add_(bias)
        return y.view(*x.shape[:-1], self.out_features)


def packed_schema(
    cls: type[PackedLinear],
    k: int,
    n: int,
    *,
    group_sizes: tuple[int, ...],
    act_dtypes: tuple[torch.dtype, ...],
    weight: Callable[[int], TensorSpec],
    meta: Callable[[int, tuple[torch.dtype, ...]], TensorSpec],
    **fields: Any,
) -> OneOf:
    """The prepared schema (:mod:`quantcore.schema`) of a ``cls`` for a K × N weight:
    one layout per op group size that divides K (the sub-group prepare chose), ``weight(g)``
    the packed codes, ``meta(g, dtypes)`` the per-group metadata (as prepared, and as cast
    for each activation dtype), ``fields`` any further field of ``cls``."""
    index = TensorSpec((k,), (torch.int64,), bounds=(0, k))
    return OneOf(*(
        Fields(
            cls, weight=weight(g), group_size=g, ret_idx=Maybe(index), bias=Maybe(TensorSpec((n,), BIAS_DTYPES)),
            in_features=k, out_features=n,
            by_dtype=DictOf(act_dtypes, _by_dtype_entry(meta, g, n)),
            **{cls.META: meta(g, (torch.float32,))}, **fields,
        )
        for g in group_sizes if g > 0 and k % g == 0
    ))


def _by_dtype_entry(
    meta: Callable[[int, tuple[torch.dtype, ...]], TensorSpec], g: int, n: int
) -> Callable[[torch.dtype], tuple[TensorSpec, Maybe]]:
    """The pattern of the ``by_dtype`` entry of an activation dtype, at group size ``g``:
    the metadata and the optional bias, cast to that dtype."""
    def entry(dtype: torch.dtype) -> tuple[TensorSpec, Maybe]:
        return meta(g, (dtype,)), Maybe(TensorSpec((n,), (dtype,)))
    return entry


def expect_prepared(prepared: Any, cls: type[PackedLinear], kernel: str) -> None:
    if type(prepared) is not cls:
        raise KernelInputError(
            f"prepared: expected the {cls.__name__} that {kernel}.prepare returns, got {type(prepared).__name__}"
        )


def int4pack_supports(
    problem: Problem,
    *,
    op: str,
    act_dtypes: tuple[torch.dtype, ...],
    n_align: int,
    k_align: int,
    group_sizes: tuple[int, ...],
) -> Support:
    """The limits torch's int4pack ops share, for a GPTQ problem: 4-bit codes, some
    activation dtypes, N and K alignment, and a menu of group sizes of which one must
    divide the checkpoint's (sub-groups of it carry the group's scale)."""
    fmt = problem.format
    if not isinstance(fmt, GPTQ):
        return Support.no(f"format {fmt.slug} is not GPTQ")
    if fmt.bits != 4:
        return Support.no(f"bits={fmt.bits}: {op} takes 4-bit codes only")
    if problem.act_dtype not in act_dtypes:
        return Support.no(f"activation dtype {problem.act_dtype}: {op} takes {', '.join(dtype_name(d) for d in act_dtypes)}")
    n, k = problem.get("N"), problem.get("K")
    if n is not None and n % n_align:
        return Support.no(f"N={n}: {op} packs weights only when N % {n_align} == 0")
    gs = fmt.group_size if fmt.group_size != -1 else k
    if gs is not None and not any(gs % g == 0 for g in group_sizes):
        return Support.no(
            f"group_size={fmt.group_size}: {op} takes groups of {'/'.join(map(str, group_sizes))} and none of them divides it"
        )
    if k is not None and k % k_align:
        return Support.no(f"K={k}: {op} needs K % {k_align} == 0")
    return Support.yes()


def int4pack_cost(
    problem: Problem,
    *,
    group_sizes: tuple[int, ...],
    bandwidth: float,
    compute: float,
    note: str = "",
    stream_bytes_per_s: float = math.inf,
) -> Cost:
    """The cost of one call of a torch int4pack op (:mod:`quantcore.cost`): the int4 codes,
    one scale and one zero per (op group, column) in the activation dtype — the op's group
    being the largest of ``group_sizes`` dividing the checkpoint's — x read, y written."""
    fmt = problem.format
    k = problem["K"]
    gs = getattr(fmt, "group_size", -1)
    gs = k if gs in (-1, None) else gs
    op_group = max((g for g in group_sizes if g > 0 and gs % g == 0), default=max(group_sizes[0], 1))
    weight = grouped_weight_bytes(k, problem["N"], 4, op_group, scale_bytes=2 * problem.act_dtype.itemsize)
    return linear_cost(problem, weight, bandwidth=bandwidth, compute=compute, note=note,
                       stream_bytes_per_s=stream_bytes_per_s)
