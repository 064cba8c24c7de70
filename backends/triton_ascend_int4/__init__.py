"""``triton_ascend_int4``: the SVDQuant pre-GEMM writing INT4 (signed codes, fp16 scales
per 64) and the LoRA-down output, from the same Triton source as ``triton_nvfp4``
(``quantcore.kernels.svdquant``) with the format switched at compile time.

Its target is the Ascend NPU (cube units have INT4 MMA, no FP4): there it needs
torch_npu and triton-ascend, probed, and the cell says SKIP with the reason where they
are missing. The same class also accepts CUDA (SM >= 8.0) and the CPU interpreter, so
the one INT4 code path the NPU compiles is proven bit-exact here and on an H100 —
a single registration rather than a third name for the same kernel. Priority: highest
on the NPU, below nothing else on CUDA, below plain torch under the interpreter.

Not yet run on an NPU: the source uses only core ``triton.language`` (loads, stores,
``tl.dot``, reshape/split, integer bit operations, ``tl.math.div_rn``), and must be
launched without FMA contraction (``enable_fp_fusion=False``) for the INT4 rounding to
be exact; an NPU lane (``nox -s npu``) is what proves it there.
"""

from __future__ import annotations

from typing import ClassVar

from quantcore.kernel import Requirements
from quantcore.kernels.svdquant.triton_kernel import TritonActQuantLora
from quantcore.probe import Capabilities
from quantcore.registry import hookimpl
from quantcore.triton import TESTED_TRITON

__all__ = ["TritonAscendInt4"]

NPU_REQUIREMENTS = Requirements(device_types=frozenset({"npu"}), packages=("torch_npu", "triton"))


class TritonAscendInt4(TritonActQuantLora):
    name: ClassVar[str] = "triton_ascend_int4"
    fp4_only: ClassVar[bool | None] = False
    priority: ClassVar[int] = 100
    description: ClassVar[str] = (
        "Triton (triton-ascend): INT4 quantize + LoRA-down from one read of x (NPU; also CUDA, interpreter)"
    )
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"npu", "cuda", "cpu"}), packages=("triton",),
        min_versions=(TESTED_TRITON,)
    )
    cuda_bandwidth: ClassVar[float] = 0.43

    @classmethod
    def check_device(cls, caps: Capabilities) -> str | None:
        if caps.device_type == "npu":
            return NPU_REQUIREMENTS.check(caps)
        return super().check_device(caps)

    @classmethod
    def priority_on(cls, caps: Capabilities) -> int:
        return {"npu": cls.priority, "cuda": 50}.get(caps.device_type, 1)


@hookimpl
def quantcore_kernels() -> list[type]:
    return [TritonAscendInt4]
