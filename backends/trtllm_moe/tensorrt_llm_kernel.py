"""``tensorrt_llm``: TensorRT-LLM's own MoE fed the preprocessed weights, where it can be.

``prepare`` produces exactly what TensorRT-LLM's MoE plugin takes for INT8 group-wise
weights (docs/formats/trtllm_moe.md): the codes through TensorRT-LLM's preprocessor for this GPU with
``force_interleave`` (the MoE path: SM 90 gets the SM 80 layout), viewed as fp16, and
the scales / zeros as stored. :func:`plugin_tensors` is that step alone, usable
without TensorRT-LLM.

Running it needs a Python entry point into TensorRT-LLM's INT8 *group-wise* MoE GEMM.
In the TensorRT-LLM sources read for this backend the PyTorch-flow op
``torch.ops.trtllm.fused_moe`` takes INT8 weights per channel only
(``INT8WoqPerChannelFusedMoEMethod``) and group-wise scales only for INT4 weights; INT8
group-wise MoE is the TensorRT plugin's (``mixtureOfExpertsPlugin`` with
``GroupwiseQuantAlgo``), reachable only by building an engine. So the device check
imports ``tensorrt_llm`` (only when asked about a CUDA device that has it) and refuses
with that reason unless the installed version registers an op named in
:data:`GROUPWISE_INT8_MOE_OPS`. Nothing here was run against a real install: neither
this machine nor the H100 used for this project has ``tensorrt_llm``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from quantcore.errors import UnsupportedProblemError
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.kernel import Requirements, Support
from quantcore.kernels.trtllm_moe import TRTLLMMoEKernel
from quantcore.probe import Capabilities
from quantcore.problem import Problem

from .preprocess import CutlassMixedGemmLayout, QuantType, as_plugin_tensor
from .weights import load_expert_weights

__all__ = ["GROUPWISE_INT8_MOE_OPS", "PluginTensors", "TensorRTLLMMoE", "plugin_tensors"]

#: ``torch.ops.trtllm`` ops that would run an INT8 group-wise MoE GEMM; none is known yet.
GROUPWISE_INT8_MOE_OPS: tuple[str, ...] = ()


@dataclass(frozen=True)
class PluginTensors:
    weight: torch.Tensor  # [E, K, N/2] float16 view of the preprocessed int8 bytes
    scales: torch.Tensor  # [E, K/group, N]
    zeros: torch.Tensor | None
    arch: int  # the SM the layout was made for (before force_interleave)
    group_size: int


def plugin_tensors(fmt: TRTLLMMoE, tensors: Mapping[str, torch.Tensor], arch: int) -> PluginTensors:
    """The MoE plugin's inputs for one weight set, for a GPU of SM ``arch``."""
    fmt.validate(tensors)
    layout = CutlassMixedGemmLayout(QuantType.W8_A16, arch=arch, force_interleave=True)
    return PluginTensors(
        weight=as_plugin_tensor(layout.apply(tensors["qweight"])),
        scales=tensors["scales"],
        zeros=tensors.get("zeros"),
        arch=arch,
        group_size=fmt.group_size,
    )


def _groupwise_op_reason() -> str | None:
    """Why the installed tensorrt_llm cannot run this, or None if it can."""
    try:
        import tensorrt_llm  # noqa: F401  (registers torch.ops.trtllm)
    except Exception as exc:  # a broken install is an answer, not a crash
        return f"tensorrt_llm failed to import: {type(exc).__name__}: {exc}"
    found = [name for name in GROUPWISE_INT8_MOE_OPS if hasattr(torch.ops.trtllm, name)]
    if found:
        return None
    version = getattr(__import__("tensorrt_llm"), "__version__", "?")
    return (
        f"tensorrt_llm {version}: no Python op runs an INT8 group-wise MoE GEMM "
        "(torch.ops.trtllm.fused_moe takes INT8 per channel only; group-wise INT8 MoE is the "
        "TensorRT plugin's, which needs an engine build)"
    )


class TensorRTLLMMoE(TRTLLMMoEKernel):
    name: ClassVar[str] = "tensorrt_llm"
    prepared_type: ClassVar[type] = PluginTensors
    priority: ClassVar[int] = 80
    description: ClassVar[str] = "TensorRT-LLM's MoE on its own preprocessed layout (needs tensorrt_llm)"
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda"}), min_capability=(7, 5), packages=("tensorrt_llm",)
    )

    @classmethod
    def check_device(cls, caps: Capabilities) -> str | None:
        return cls.requires.check(caps) or _groupwise_op_reason()

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        base = super().supports(problem)
        if not base:
            return base
        fmt: TRTLLMMoE = problem.format  # type: ignore[assignment]
        if fmt.scale_dtype != problem.act_dtype:
            return Support.no(f"scales in {fmt.scale_dtype}: TensorRT-LLM wants them in the activation dtype")
        k, n = problem.get("K"), problem.get("N")
        if (k is not None and k % 64) or (n is not None and n % 32):
            return Support.no(f"K={k}, N={n}: the preprocessor needs K % 64 == 0 and N % 32 == 0")
        return Support.yes()

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> PluginTensors:
        w = load_expert_weights(self.fmt, tensors, self.device, dtype)  # type: ignore[arg-type]
        major, minor = torch.cuda.get_device_capability(self.device)
        stored = {"qweight": w.qweight, "scales": w.scales}
        if w.zeros is not None:
            stored["zeros"] = w.zeros
        return plugin_tensors(self.fmt, stored, 10 * major + minor)  # type: ignore[arg-type]

    def __call__(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        prepared: PluginTensors,
        *,
        topk_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self.require_prepared(prepared)
        reason = _groupwise_op_reason()
        raise UnsupportedProblemError(reason or "tensorrt_llm: the group-wise INT8 MoE call is not wired yet")
