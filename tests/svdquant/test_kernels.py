"""The act_quant_lora kernels as a user meets them: which one get_kernel picks where,
why the others are refused, and the package's own errors for bad input."""

from __future__ import annotations

import pytest
import torch

import quantcore
from quantcore.backends.svdquant_torch import TorchActQuantLora
from quantcore.backends.triton_ascend_int4 import TritonAscendInt4
from quantcore.backends.triton_nvfp4 import TritonNVFP4
from quantcore.errors import KernelInputError, TensorFormatError, UnsupportedProblemError
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.ops.act_quant_lora import act_quant_lora_problem, act_quant_lora_reference
from quantcore.registry import Registry

NVFP4, INT4 = SVDQuantAct(fp4=True), SVDQuantAct(fp4=False)


def _layer(n: int = 64, r: int = 8) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "lora_down": (torch.randn(n, r, generator=gen) * 0.1).to(torch.bfloat16),
        "smooth": torch.exp(torch.randn(n, generator=gen) * 0.3).to(torch.bfloat16),
    }


def test_registered_under_their_entry_point_names(registry: Registry) -> None:
    plugins = {p.name for p in registry.plugins()}
    assert {"triton_nvfp4", "triton_ascend_int4", "svdquant_torch"} <= plugins
    names = {e.cls.name for e in registry.kernels("svdquant", "act_quant_lora")}
    assert names == {"triton_nvfp4", "triton_ascend_int4", "svdquant_torch"}


@pytest.mark.parametrize(("fmt", "triton_name"), [(NVFP4, "triton_nvfp4"), (INT4, "triton_ascend_int4")])
def test_cpu_picks_plain_torch_and_ranks_the_interpreter_below_it(
    fmt: SVDQuantAct, triton_name: str, registry: Registry
) -> None:
    problem = act_quant_lora_problem(fmt, M=256, N=3840, R=32)
    table = quantcore.explain(fmt, "cpu", problem=problem, registry=registry)
    by_name = {c.kernel: c for c in table.candidates}
    assert table.selected is not None and table.selected.kernel == "svdquant_torch"
    other = by_name["triton_ascend_int4" if triton_name == "triton_nvfp4" else "triton_nvfp4"]
    triton = by_name[triton_name]
    assert other.status == "refused"
    if triton.status == "usable":  # the interpreter is on (the pytest plugin sets it on CPU runs)
        assert triton.priority == 1
        assert "only" in other.reason  # refused by supports(): the other code format
    else:  # a GPU machine testing --qc-device cuda: Triton on "cpu" is refused at the device check
        assert "TRITON_INTERPRET" in triton.reason and "TRITON_INTERPRET" in other.reason


def test_npu_without_torch_npu_refuses_with_the_reason(registry: Registry) -> None:
    problem = act_quant_lora_problem(INT4, M=1, N=64, R=32)
    table = quantcore.explain(INT4, "npu", problem=problem, registry=registry)
    ascend = next(c for c in table.candidates if c.kernel == "triton_ascend_int4")
    assert ascend.status == "refused" and "torch_npu" in ascend.reason
    assert ascend.priority in (1, 100)


def test_supports_states_the_limits() -> None:
    def ok(kernel: type, fmt: SVDQuantAct, n: int, r: int, dtype: torch.dtype = torch.bfloat16) -> tuple[bool, str]:
        return tuple(kernel.supports(act_quant_lora_problem(fmt, M=1, N=n, R=r, dtype=dtype)))  # type: ignore[attr-defined, return-value]

    assert ok(TritonNVFP4, NVFP4, 3840, 256)[0]
    assert ok(TritonNVFP4, NVFP4, 40, 32) == (False, "N=40: not a multiple of the svdquant-nvfp4 block size 16")
    assert ok(TritonAscendInt4, INT4, 96, 32)[1] == "N=96: not a multiple of the svdquant-int4 block size 64"
    assert not ok(TritonNVFP4, INT4, 64, 32)[0] and not ok(TritonAscendInt4, NVFP4, 64, 32)[0]
    assert ok(TritonNVFP4, NVFP4, 64, 512)[1].startswith("R=512: the [BM, R] LoRA accumulator")
    assert ok(TorchActQuantLora, NVFP4, 64, 512)[0]
    assert "float32" in ok(TorchActQuantLora, NVFP4, 64, 8, torch.float32)[1]


def test_torch_kernel_equals_golden_with_hard_rows() -> None:
    gen = torch.Generator().manual_seed(5)
    for fmt in (NVFP4, INT4):
        x = (torch.randn(5, 128, generator=gen) * 3).to(torch.float16)
        x[0] = 0
        x[1, 3] = float("nan")
        x[2, 70] = float("inf")
        layer = _layer(128, 16)
        kernel = TorchActQuantLora(fmt, "cpu")
        out = kernel(x, kernel.prepare(layer, dtype=torch.float16))
        ref = act_quant_lora_reference(fmt, x, layer["lora_down"], layer["smooth"])
        bits = torch.uint8 if fmt.fp4 else torch.int16
        assert torch.equal(out.qout, ref.qout)
        assert torch.equal(out.oscales.view(bits), ref.oscales.view(bits))
        assert torch.equal(out.lora_act_out.isnan(), ref.lora_act_out.isnan())
        fin = torch.isfinite(ref.lora_act_out)
        assert torch.allclose(out.lora_act_out.double()[fin], ref.lora_act_out[fin], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel_cls", [TorchActQuantLora, TritonNVFP4])
def test_bad_calls_raise_the_packages_errors(kernel_cls: type) -> None:
    kernel = kernel_cls(NVFP4, "cpu")
    prepared = kernel.prepare(_layer(), dtype=torch.bfloat16)
    with pytest.raises(KernelInputError, match=r"x: expected \[M, 64\] bfloat16 on cpu, got \(3, 32\) bfloat16 on cpu"):
        kernel(torch.zeros(3, 32, dtype=torch.bfloat16), prepared)
    with pytest.raises(KernelInputError, match=r"x: expected \[M, 64\] bfloat16 on cpu, got \(3, 64\) float16"):
        kernel(torch.zeros(3, 64, dtype=torch.float16), prepared)
    with pytest.raises(KernelInputError, match=r"x: expected a torch.Tensor, got list"):
        kernel([1.0], prepared)
    with pytest.raises(KernelInputError, match=r"prepared: expected the SVDQuantWeights .* got dict"):
        kernel(torch.zeros(3, 64, dtype=torch.bfloat16), {})
    with pytest.raises(KernelInputError, match=r"dtype: expected float16 or bfloat16 activations, got torch.float32"):
        kernel.prepare(_layer(), dtype=torch.float32)
    with pytest.raises(TensorFormatError, match=r"lora_down: N=40 must be a positive multiple"):
        kernel.prepare({"lora_down": torch.zeros(40, 8, dtype=torch.bfloat16)})


def test_prepare_refuses_what_supports_refuses() -> None:
    with pytest.raises(UnsupportedProblemError, match=r"triton_nvfp4: R=300"):
        TritonNVFP4(NVFP4, "cpu").prepare({"lora_down": torch.zeros(64, 300, dtype=torch.bfloat16)})
    with pytest.raises(UnsupportedProblemError, match=r"writes INT4 \(fp4=False\) only"):
        TritonAscendInt4(NVFP4, "cpu").prepare(_layer())


def test_empty_batch_and_no_lora() -> None:
    kernel = TorchActQuantLora(NVFP4, "cpu")
    prepared = kernel.prepare({"lora_down": torch.zeros(64, 0, dtype=torch.bfloat16)})
    out = kernel(torch.ones(0, 64, dtype=torch.bfloat16), prepared)
    assert [tuple(t.shape) for t in out] == [(0, 32), (4, 0), (0, 0)]
    out = kernel(torch.ones(3, 64, dtype=torch.bfloat16), prepared)
    assert [tuple(t.shape) for t in out] == [(256, 32), (4, 256), (256, 0)]
