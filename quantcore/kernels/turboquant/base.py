"""The runtime contract of TurboQuant kernels: one pass at a time (docs/formats/turboquant.md).

The forward of a two-pass weight is ``pass(x, pass 1) + pass(x, pass 2) + bias``.
Kernels expose exactly that step, :meth:`TurboQuantLinearKernel.run_pass`, on a
:class:`PassData` — a pass's tensors in the kernel's layout, made by
:mod:`quantcore.transforms.turboquant_passes` — so that the CPU-offload path
(:mod:`quantcore.nn.turboquant.offload`) can hand pass 2 to the kernel from a GPU scratch
slot instead of from resident memory, with no kernel knowing the difference.
:class:`quantcore.nn.turboquant.TurboQuantLinear` relies on that contract; every
TurboQuant backend implements it, and the fused ones through :mod:`.fused`.

Numerics policy (``compute_dtype``): on CPU every step runs in float32 (the Triton
interpreter's ``tl.dot`` is only right in fp32, docs/triton-interpreter.md); on a GPU
the input rotation is a GEMM in the activation dtype (tensor cores, fp32 accumulation)
and the weight side is fed to the matrix units in the activation dtype, accumulating in
fp32. Each pass accumulates in fp32; the output is rounded to the activation dtype once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ...dtypes import dtype_name
from ...errors import KernelInputError
from ...formats.turboquant.format import PASS_TENSORS, TurboQuant
from ...kernel import LinearKernel, Support
from ...problem import Problem
from ...schema import Fields, Maybe, OneOf, TensorSpec
from ...tensors import check_activation, stored_on
from ...transforms.turboquant_passes import PassData, TurboQuantPassTransform

__all__ = [
    "ACT_DTYPES",
    "PassData",
    "TurboQuantLinearKernel",
    "TurboQuantPrepared",
    "compute_dtype",
    "pad_codebook",
    "pass_tensors",
    "rotate_input",
    "turboquant_support",
]

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def compute_dtype(device: torch.device, act_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype the input rotation and the matrix units run in (see module docstring)."""
    if device.type == "cpu" or act_dtype is None:
        return torch.float32
    return act_dtype


@dataclass
class TurboQuantPrepared:
    passes: tuple[PassData, ...]
    codebook: torch.Tensor  # [2^bits] float32
    bias: torch.Tensor | None  # [N] float32
    in_features: int
    out_features: int
    group_size: int
    #: The rotation layout the passes were prepared in (the kernel's ``split_halves``):
    #: a kernel of the other layout would read them in the wrong order.
    split_halves: bool = False
    #: Per-kernel derived state (lookup tables per dtype, ...), filled lazily.
    cache: dict[Any, Any] = field(default_factory=dict)


#: Codebooks are padded to 16 entries for the kernels: one on-chip table shape for every
#: ``bits`` (Triton 3.6 fails to compile ``tl.gather`` from a 4-entry source), and the
#: padding is never indexed because validated indices stay below ``2^bits``.
CODEBOOK_SLOTS = 16


def pad_codebook(codebook: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(CODEBOOK_SLOTS, dtype=torch.float32, device=codebook.device)
    out[: codebook.shape[0]] = codebook.to(torch.float32)
    return out


def pass_tensors(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """``{"indices", "norms", "rotation"}`` of the pass whose names start with ``prefix``."""
    return {name: tensors[prefix + name] for name in PASS_TENSORS}


def rotate_input(x2d: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """``x_g @ rotation[r]`` for every group g of d columns (r = g, or 0 when shared):
    the small separate GEMM that moves Π_g from the weight to the activation."""
    m, k = x2d.shape
    r, d, _ = rotation.shape
    x = x2d if x2d.dtype == rotation.dtype else x2d.to(rotation.dtype)
    if r == 1:
        return (x.reshape(m * (k // d), d) @ rotation[0]).reshape(m, k)
    rotated = torch.bmm(x.reshape(m, k // d, d).transpose(0, 1), rotation)  # [G, M, d]
    return rotated.transpose(0, 1).reshape(m, k)


def turboquant_support(problem: Problem, act_dtypes: Sequence[torch.dtype]) -> Support:
    """Whether ``problem`` is a TurboQuant linear in one of ``act_dtypes`` whose K holds
    whole groups: what every TurboQuant kernel asks first."""
    fmt = problem.format
    if not isinstance(fmt, TurboQuant):
        return Support.no(f"format {fmt.slug} is not TurboQuant")
    if problem.act_dtype not in act_dtypes:
        names = ", ".join(dtype_name(d) for d in act_dtypes)
        return Support.no(f"activation dtype {dtype_name(problem.act_dtype)}: expected {names}")
    k = problem.get("K")
    if k is not None and k % fmt.group_size:
        return Support.no(f"K={k} is not a multiple of group_size={fmt.group_size}")
    return Support.yes()


class TurboQuantLinearKernel(LinearKernel):
    """Base of the TurboQuant linear kernels: validation, the two-pass composition and
    the per-pass preparation; subclasses implement :meth:`run_pass` and say, through
    ``split_halves``, which order their rotations put the rotated coordinates in."""

    format: ClassVar[str] = "turboquant"
    #: True: the rotation writes each group's even coordinates first, then its odd ones,
    #: so the low and the high nibbles of a byte row meet contiguous activations
    #: (see quantcore/transforms/turboquant_passes.py).
    split_halves: ClassVar[bool] = False

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        return turboquant_support(problem, ACT_DTYPES)

    # --- preparation ----------------------------------------------------------------------

    def compute_dtype(self, act_dtype: torch.dtype | None) -> torch.dtype:
        return compute_dtype(self.device, act_dtype)

    def prepare_pass(self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype) -> PassData:
        """One pass (``indices``, ``norms``, ``rotation``) → PassData on the tensors' own
        device, the rotation cast to ``dtype``. Pure: the offload path runs it on CPU."""
        fp32 = TurboQuantPassTransform(self.fmt, split_halves=self.split_halves).apply(tensors)  # type: ignore[arg-type]
        return dataclasses.replace(fp32, rotation=fp32.rotation.to(dtype))

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> TurboQuantPrepared:
        fmt = self.fmt
        assert isinstance(fmt, TurboQuant)
        tensors = stored_on(tensors, self.device, where=f"{self.name} prepare")
        dims = fmt.validate(tensors)
        if dtype is not None and dtype not in ACT_DTYPES:
            raise KernelInputError(f"dtype: expected bf16, fp16 or fp32, got {dtype}")
        cdt = self.compute_dtype(dtype)
        bias = tensors.get("bias")
        return TurboQuantPrepared(
            passes=tuple(self.prepare_pass(pass_tensors(tensors, p), dtype=cdt) for p in fmt.passes),
            codebook=pad_codebook(tensors["codebook"]),
            bias=None if bias is None else bias.to(torch.float32),
            in_features=dims["K"],
            out_features=dims["N"],
            group_size=fmt.group_size,
            split_halves=self.split_halves,
        )

    def prepared_schema(self, dims: Mapping[str, int]) -> Fields:
        fmt = self.fmt
        assert isinstance(fmt, TurboQuant)
        k, n, d = dims["K"], dims["N"], fmt.group_size
        one_pass = OneOf(*(Fields(
            PassData,
            indices=TensorSpec((n, k // 2), (torch.uint8,)),
            scales=TensorSpec((n, k // d), (torch.float32,)),
            rotation=TensorSpec((fmt.num_rotations(k), d, d), (rotation,)),
        ) for rotation in ACT_DTYPES))
        return Fields(
            TurboQuantPrepared,
            passes=tuple(one_pass for _ in fmt.passes),
            codebook=TensorSpec((CODEBOOK_SLOTS,), (torch.float32,)),
            bias=Maybe(TensorSpec((n,), (torch.float32,))),
            in_features=k, out_features=n, group_size=d, split_halves=self.split_halves, cache={},
        )

    # --- running --------------------------------------------------------------------------

    def run_pass(
        self,
        x2d: torch.Tensor,
        data: PassData,
        prepared: TurboQuantPrepared,
        *,
        partial: torch.Tensor | None,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """``partial + x Ŵ_passᵀ (+ bias)`` as ``[M, N]`` in ``out_dtype``; ``partial``
        (float32) carries the earlier passes. Pass ``out_dtype=torch.float32`` and no bias
        for a pass whose result another pass will extend."""
        raise NotImplementedError

    def run_passes(
        self,
        x2d: torch.Tensor,
        passes: Sequence[PassData],
        prepared: TurboQuantPrepared,
        *,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """``x (Σ_passes Ŵ_p)ᵀ (+ bias)``: the passes one after another through
        :meth:`run_pass`; a kernel that fuses them into one launch overrides this."""
        out: torch.Tensor | None = None
        last = len(passes) - 1
        for i, data in enumerate(passes):
            final = i == last
            out = self.run_pass(x2d, data, prepared, partial=out, bias=bias if final else None,
                                out_dtype=out_dtype if final else torch.float32)
        assert out is not None
        return out

    def check_input(self, x: torch.Tensor, prepared: TurboQuantPrepared) -> None:
        if type(prepared) is not TurboQuantPrepared:
            raise KernelInputError(
                f"prepared: expected the TurboQuantPrepared that {self.name}.prepare returns, "
                f"got {type(prepared).__name__}"
            )
        if prepared.split_halves != self.split_halves:
            raise KernelInputError(
                f"prepared: its rotations are in the split_halves={prepared.split_halves} layout of another "
                f"kernel; {self.name} reads split_halves={self.split_halves} (prepare with {self.name})"
            )
        k = prepared.in_features
        here = prepared.codebook.device  # where prepare put the tensors ("cuda" became cuda:0)
        check_activation(x, k=k, dtypes=ACT_DTYPES, device=here)

    def __call__(self, x: torch.Tensor, prepared: TurboQuantPrepared) -> torch.Tensor:
        self.check_input(x, prepared)
        x2d = x.reshape(-1, prepared.in_features)
        out = self.run_passes(x2d, prepared.passes, prepared, bias=prepared.bias, out_dtype=x.dtype)
        return out.view(*x.shape[:-1], prepared.out_features)
