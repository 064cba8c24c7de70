"""The cuTile kernel's plan: which path a batch takes (no GPU, no cuda.tile needed)."""

from __future__ import annotations

import sys

import pytest
import torch

from quantcore.backends.turboquant_cutile import plan


def test_one_row_takes_the_gemv_and_large_batches_the_dense_gemm() -> None:
    assert not plan.dense(1, 1 << 20, sms=132)
    assert plan.dense(plan.DEQUANT_FROM_M, 1 << 20, sms=132)


@pytest.mark.parametrize(("n", "sms", "dense"), [(14336, 132, False), (4096, 132, True), (4096, 16, False)])
def test_small_batches_take_the_matrix_unit_kernel_only_where_its_tiles_fill_the_gpu(
    n: int, sms: int, dense: bool
) -> None:
    assert plan.dense(16, n, sms=sms) is dense


def test_the_cost_model_reads_the_plan_without_importing_the_launches() -> None:
    from quantcore.backends.turboquant_cutile import TurboQuantCuTile
    from quantcore.formats.turboquant import TurboQuant
    from quantcore.probe import probe
    from quantcore.problem import Problem

    caps = probe("cpu")
    for m in (1, 16, 2048):
        cost = TurboQuantCuTile.cost(caps, Problem.linear(TurboQuant(bits=4, group_size=128), M=m, K=4096, N=4096,
                                                          dtype=torch.bfloat16))
        assert cost.flops > 0 and cost.bytes > 0
    # the launches import cuda.tile, which a machine without cuTile lacks
    assert not [name for name in sys.modules if name.endswith("turboquant_cutile.tiles")]
