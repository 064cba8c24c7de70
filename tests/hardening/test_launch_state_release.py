"""A prepared weight is freed when its user drops it, after any number of calls: the launch
state a Triton backend keeps with one of the weight's tensors (``launch_state``, dropped
with that tensor) holds nothing that keeps the tensor alive — no strong reference, no view
of it, no tensor descriptor or bound argument built on one (quantcore/triton/unowned.py).

Each backend that runs under Triton's interpreter is prepared, called at two row counts
(two buckets; each path turboquant_triton takes), then every reference is dropped; its
tensor must die and the table of launch states shrink back. hopper_wgmma runs with its
launch recorded (it needs a GPU), each of its bucket kinds once; a QuantLinear's packed
weight is freed with the module."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ..interpreting import INTERPRETER, NOT_INTERPRETED

pytestmark = pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)


def _states() -> dict[int, Any]:
    from quantcore.triton import launch

    return launch._states


def _assert_freed(make: Callable[[], tuple[Any, Any]], owner_of: Callable[[Any], torch.Tensor],
                  calls: Callable[[Any, Any], None]) -> None:
    """``make()`` gives ``(kernel, prepared)``; after ``calls(kernel, prepared)`` the launch
    state of ``owner_of(prepared)`` exists, and once both are dropped the owner is dead and
    its state gone."""
    gc.collect()
    before = len(_states())
    kernel, prepared = make()
    calls(kernel, prepared)
    owner = weakref.ref(owner_of(prepared))
    assert id(owner()) in _states() and len(_states()) == before + 1
    del kernel, prepared
    gc.collect()
    assert owner() is None, "the launch state keeps the tensor it is kept for alive"
    assert len(_states()) == before


def _rows(m: int, k: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize("fmt_name", ["gptq", "awq"])
def test_triton_int4_frees_its_packed_weight(fmt_name: str) -> None:
    from quantcore.backends.triton_int4.kernel import TritonInt4AWQ, TritonInt4GPTQ
    from quantcore.formats.awq import AWQ
    from quantcore.formats.gptq import GPTQ

    fmt, cls = (GPTQ(bits=4, group_size=64, sym=False), TritonInt4GPTQ) if fmt_name == "gptq" else \
        (AWQ(group_size=64), TritonInt4AWQ)

    def make() -> tuple[Any, Any]:
        kernel = cls(fmt, torch.device("cpu"))
        return kernel, kernel.prepare(fmt.quantize(_weights(64, 128)), dtype=torch.float16)

    def calls(kernel: Any, prepared: Any) -> None:
        for m in (2, 20):  # two runs of M: two buckets (launch.INTERPRETER_BREAKS)
            assert kernel(_rows(m, 128, torch.float16), prepared).shape == (m, 64)

    _assert_freed(make, lambda p: p.qweight, calls)


def test_turboquant_triton_frees_its_codebook_on_every_path() -> None:
    from quantcore.backends.turboquant_triton import TurboQuantTriton
    from quantcore.formats.turboquant import TurboQuant

    fmt = TurboQuant(group_size=64, residual=True)

    def make() -> tuple[Any, Any]:
        gen = torch.Generator().manual_seed(0)
        tensors = fmt.quantize(_weights(48, 256), generator=gen)
        tensors["bias"] = torch.randn(48, generator=gen)
        kernel = TurboQuantTriton(fmt, "cpu")
        return kernel, kernel.prepare(tensors, dtype=torch.bfloat16)

    def calls(kernel: Any, prepared: Any) -> None:
        from quantcore.backends.turboquant_triton import fused

        choice = fused._path_choice(torch.device("cpu"))
        # The decode kernel, the tensor-core kernel, the rotations folded in (two passes fold
        # wherever the tensor-core kernel stops); dequantize + GEMM asked for by name.
        rows = (1, 16, choice.mma_max_m + 1)
        assert rows[0] <= choice.gemv_max_m < rows[1] <= choice.mma_max_m < rows[2]
        assert choice.prefill_path(rows[2], 2, 64) == "fold"
        for m in rows:
            assert kernel(_rows(m, 256, torch.bfloat16), prepared).shape == (m, 48)
        x = _rows(rows[2], 256, torch.bfloat16)
        y = fused.fused_linear(x, prepared.passes, prepared.codebook, group_size=64, partial=None, bias=prepared.bias,
                               out_dtype=torch.bfloat16, path="dequant")
        assert y.shape == (rows[2], 48)
        kinds = {type(b).__name__ for b in fused.launch_state(prepared.codebook).values()}
        assert kinds == {"_Gemv", "_Mma", "_Dequant", "_Folded"}

    _assert_freed(make, lambda p: p.codebook, calls)


def test_trtllm_moe_triton_frees_its_layout() -> None:
    from quantcore.backends.trtllm_moe import TritonMoE
    from quantcore.formats.trtllm_moe import TRTLLMMoE

    fmt = TRTLLMMoE(group_size=64, sym=False, scale_dtype=torch.bfloat16)

    def make() -> tuple[Any, Any]:
        kernel = TritonMoE(fmt, "cpu")
        return kernel, kernel.prepare(fmt.quantize(torch.randn(4, 128, 64) * 0.05), dtype=torch.bfloat16)

    def calls(kernel: Any, prepared: Any) -> None:
        gen = torch.Generator().manual_seed(2)
        for t in (1, 24):  # 2 and 48 routes: two buckets
            ids = torch.randint(0, 4, (t, 2), generator=gen)
            y = kernel(_rows(t, 128, torch.bfloat16), ids, prepared)
            assert y.shape[0] == t and torch.isfinite(y).all()

    _assert_freed(make, lambda p: p.layout, calls)


@pytest.mark.parametrize("backend", ["triton_nvfp4", "triton_ascend_int4"])
def test_svdquant_triton_frees_its_lora_down(backend: str) -> None:
    from quantcore.backends.triton_ascend_int4 import TritonAscendInt4
    from quantcore.backends.triton_nvfp4 import TritonNVFP4
    from quantcore.formats.svdquant import SVDQuantAct

    cls, fmt = (TritonNVFP4, SVDQuantAct(fp4=True)) if backend == "triton_nvfp4" else \
        (TritonAscendInt4, SVDQuantAct(fp4=False))

    def make() -> tuple[Any, Any]:
        gen = torch.Generator().manual_seed(0)
        layer = {"lora_down": (torch.randn(128, 16, generator=gen) * 0.05).to(torch.bfloat16),
                 "smooth": torch.exp(torch.randn(128, generator=gen) * 0.5).to(torch.bfloat16)}
        kernel = cls(fmt, "cpu")
        return kernel, kernel.prepare(layer, dtype=torch.bfloat16)

    def calls(kernel: Any, prepared: Any) -> None:
        for m in (3, 70):  # two padded row counts: two buckets
            assert kernel(_rows(m, 128, torch.bfloat16), prepared).qout.shape[0] >= m

    _assert_freed(make, lambda p: p.lora_down, calls)


def test_hopper_wgmma_frees_its_packed_weight_from_both_kinds_of_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.backends.hopper_wgmma import launch, small_m
    from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
    from quantcore.backends.hopper_wgmma.plans import Plan, TritonPlan
    from quantcore.formats.gptq import GPTQ
    from tests.launch_recorder import Recorder, record_launches

    recorded = record_launches(monkeypatch, launch)
    monkeypatch.setattr(small_m, "Launch", Recorder)
    # One row: a small-M Triton plan (small_m.py); more: a wgmma plan with a split (launch.py).
    plans = {1: TritonPlan("gemv", block_n=64), 3: Plan(wg=1, bm=16, stages=4, split=2)}
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plans[m])
    fmt = GPTQ(bits=4, group_size=128, sym=True)  # no zero points: the zeros descriptor views the weight

    def make() -> tuple[Any, Any]:
        kernel = HopperWgmmaGPTQ(fmt, "cpu")
        return kernel, kernel.prepare(fmt.quantize(_weights(256, 512)), dtype=torch.bfloat16)

    def calls(kernel: Any, prepared: Any) -> None:
        for m in (1, 3, 1, 3):
            assert kernel(_rows(m, 512, torch.bfloat16), prepared).shape == (m, 256)
        assert len(recorded) == 2 and all(len(r.calls) == 2 for r in recorded)

    _assert_freed(make, lambda p: p.qweight, calls)


def test_a_deleted_quant_linear_frees_its_packed_weight() -> None:
    from quantcore.formats.gptq import GPTQ
    from quantcore.nn.linear import QuantLinear

    fmt = GPTQ(bits=4, group_size=64, sym=True)
    gc.collect()
    before = len(_states())
    module = QuantLinear(fmt, fmt.quantize(_weights(64, 128)), device="cpu", dtype=torch.float16,
                         prefer="triton_int4")
    assert module.kernel is not None and module.kernel.name == "triton_int4"
    for m in (1, 20):
        assert module(_rows(m, 128, torch.float16)).shape == (m, 64)
    packed = weakref.ref(module.prepared.qweight)
    assert len(_states()) == before + 1
    del module
    gc.collect()
    assert packed() is None, "the launch state keeps the module's packed weight alive"
    assert len(_states()) == before
