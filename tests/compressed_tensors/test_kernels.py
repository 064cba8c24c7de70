"""The compressed_tensors kernels are ordinary quantcore kernels: a QuantLinear of the
pack-quantized format binds the GPTQ kernel behind the transform, its call is the
``quantcore::linear`` custom op with a correct fake (opcheck), and its state dict loads
into a skeleton built on ``meta``."""

from __future__ import annotations

import pytest
import torch

from quantcore.custom_ops import KernelOp
from quantcore.formats.compressed_tensors import CompressedTensors
from quantcore.nn.linear import QuantLinear
from quantcore.ops.linear import linear_reference
from quantcore.ops.tolerance import judge_output


@pytest.mark.parametrize("fmt, kernel", [
    (CompressedTensors(bits=4, group_size=32, sym=False, act_order=True), "aten_cpu"),
    (CompressedTensors(bits=8, group_size=-1, sym=True), "torch_fallback"),
])
def test_a_pack_quantized_layer_runs_as_an_op_and_reloads(fmt: CompressedTensors, kernel: str) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = fmt.quantize(torch.randn(128, 256, generator=gen) * 0.05, generator=gen)
    layer = QuantLinear(fmt, tensors, dtype=torch.bfloat16)
    assert layer.kernel is not None and layer.kernel.name == kernel
    x = torch.randn(5, 256, generator=gen).to(torch.bfloat16)
    y = layer(x)
    verdict = judge_output(y, linear_reference(x, fmt.dequantize(tensors)), torch.bfloat16)
    assert verdict.ok, verdict.problem

    op = KernelOp(layer.kernel, layer.prepared, dict(layer.dims))
    args = (x, list(op.state.tensors), op.spec)
    report = torch.library.opcheck(torch.ops.quantcore.linear.default, args, test_utils=("test_schema", "test_faketensor"))
    assert set(report.values()) == {"SUCCESS"}, report
    assert torch.equal(torch.ops.quantcore.linear.default(*args), y)

    skeleton = QuantLinear(fmt, in_features=256, out_features=128, device="meta")
    skeleton.load_state_dict(layer.state_dict(), assign=True)
    assert skeleton.kernel is not None and skeleton.kernel.name == kernel and torch.equal(skeleton(x), y)
