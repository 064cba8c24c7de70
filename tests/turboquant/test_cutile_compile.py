"""The cuTile kernels compile for Hopper (sm_90) ahead of time, no GPU needed, wherever
cuda.tile and its compiler are installed (docs/cutile.md); skipped elsewhere."""

from __future__ import annotations

import importlib.util
import io
import shutil

import pytest


def _cutile_here() -> bool:
    try:
        found = importlib.util.find_spec("cuda.tile") is not None
    except (ImportError, ValueError):
        found = False
    return found and shutil.which("tileiras") is not None


pytestmark = pytest.mark.skipif(not _cutile_here(), reason="cuda.tile or tileiras not installed")


@pytest.mark.parametrize("kind", ["gemv", "gemm", "dequant"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_kernels_compile_for_sm90(kind: str, dtype: str) -> None:
    import cuda.tile as ct
    from cuda.tile.compilation import (
        ArrayConstraint,
        CallingConvention,
        KernelSignature,
        ScalarConstraint,
        export_kernel,
    )

    from quantcore.backends.turboquant_cutile import kernels, plan

    def array(dt: object, ndim: int) -> ArrayConstraint:
        return ArrayConstraint(dt, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0,
                               alias_groups=(), may_alias_internally=False)

    x = getattr(ct, dtype)
    operands = [array(x, 2), array(ct.uint8, 2), array(ct.float32, 2), array(ct.float32, 1), array(x, 2),
                array(ct.float32, 2), array(ct.float32, 1), ScalarConstraint(ct.int32), ScalarConstraint(ct.int32)]
    if kind == "gemv":
        kernel, params = kernels.gemv, [*operands, 64, plan.GEMV_ROWS]
    elif kind == "gemm":
        kernel, params = kernels.gemm, [*operands, 64, *plan.gemm_tiles(64, 64)]
    else:
        kernel, params = kernels.dequant, [array(ct.uint8, 2), array(ct.float32, 2), array(ct.float32, 1),
                                           array(x, 2), 64, plan.DEQUANT_ROWS]
    signature = KernelSignature(params, CallingConvention.cutile_python_v1())
    out = io.BytesIO()
    export_kernel(kernel, [signature], out, gpu_code="sm_90", output_format="cubin")
    assert len(out.getvalue()) > 0
