"""An op kind is declared once, and the rest comes from the declaration: its custom op
(schema and fake), the module that runs any format of it, and that module's one call
route with its state held once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import quantcore.custom_ops
from quantcore.custom_ops import flatten
from quantcore.errors import InvalidArgumentError, KernelInputError
from quantcore.formats.gptq import GPTQ
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.nn.linear import QuantLinear
from quantcore.nn.moe import QuantExperts
from quantcore.nn.quant_module import QuantModule
from quantcore.ops import get_op, op_kinds
from quantcore.ops.harness import OpHarness

OPS_FOLDER = Path(quantcore.ops.__file__).parent
GPTQ4 = GPTQ(bits=4, group_size=32)
MOE = TRTLLMMoE(group_size=64)


def _linear(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return GPTQ4.quantize(torch.randn(64, 256, generator=gen) * 0.05, generator=gen)


def _experts(seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return MOE.quantize(torch.randn(4, 128, 64, generator=gen) * 0.05)


def test_every_folder_under_ops_is_an_op_kind_with_its_custom_op() -> None:
    folders = {p.name for p in OPS_FOLDER.iterdir() if (p / "__init__.py").exists()}
    assert set(op_kinds()) == folders == {"linear", "moe", "act_quant_lora"}
    for name, op in op_kinds().items():
        assert (OPS_FOLDER / name / "reference.py").exists() and isinstance(op.harness, OpHarness)
        assert set(op.weight_dims) < set(op.dims) and set(op.may_be_zero) <= set(op.dims)
        schema = str(getattr(torch.ops.quantcore, name).default._schema)
        assert schema == f"quantcore::{name}{op.schema}"
    with pytest.raises(KeyError, match=r"op: expected one of \['act_quant_lora', 'linear', 'moe'\], got 'conv'"):
        get_op("conv")


def test_the_fake_is_the_declared_output_rule_and_checks_the_weight_dims() -> None:
    layer = QuantLinear(GPTQ4, _linear())
    y = layer(torch.empty(5, 3, 256, dtype=torch.bfloat16, device="meta"))
    assert y.shape == (5, 3, 64) and y.device.type == "meta"
    with pytest.raises(KernelInputError, match=r"x: expected \[\.\.\., 256\], got \(2, 100\)"):
        layer(torch.empty(2, 100, dtype=torch.bfloat16, device="meta"))
    experts = QuantExperts(MOE, _experts())
    x = torch.empty(3, 128, dtype=torch.bfloat16, device="meta")
    ids = torch.empty(3, 2, dtype=torch.int32, device="meta")
    assert experts(x, ids).shape == (3, 2, 64)
    assert experts(x, ids, torch.empty(3, 2, device="meta")).shape == (3, 64)


def test_a_module_of_any_op_kind_comes_from_its_declaration() -> None:
    """``QuantModule(fmt, tensors)`` runs the format's op kind; the named modules only add
    their constructor arguments."""
    gen = torch.Generator().manual_seed(2)
    generic = QuantModule(MOE, _experts())
    named = QuantExperts(MOE, _experts())
    assert generic.op is get_op("moe") and generic.dims == named.dims == {"E": 4, "K": 128, "N": 64}
    x = torch.randn(3, 128, generator=gen).bfloat16()
    ids = torch.randint(0, 4, (3, 2), generator=gen, dtype=torch.int32)
    w = torch.softmax(torch.randn(3, 2, generator=gen), dim=-1)
    assert torch.equal(generic(x, ids, topk_weights=w), named(x, ids, w))
    x = torch.randn(2, 256, generator=gen).bfloat16()
    assert torch.equal(QuantModule(GPTQ4, _linear())(x), QuantLinear(GPTQ4, _linear())(x))
    with pytest.raises(InvalidArgumentError, match=r"QuantLinear runs linear; trtllm_moe.* is a moe format"):
        QuantLinear(MOE, _experts())
    with pytest.raises(InvalidArgumentError, match=r"the weight dims \['E', 'K', 'N'\]"):
        QuantModule(MOE, dims={"K": 128, "N": 64})


def _state_ids(layer: QuantModule) -> set[int]:
    return {id(t) for t in flatten(layer.prepared).tensors}


def test_the_prepared_state_is_held_once_and_follows_moves_and_loads() -> None:
    """The prepared object is built on the buffers themselves (no second copy), after a
    move and after a load too; the eager call is the kernel's own, bit for bit."""
    layer = QuantLinear(GPTQ4, _linear())
    buffers = {id(b) for b in layer.buffers()}
    assert _state_ids(layer) == buffers
    x = torch.randn(3, 256).bfloat16()
    assert layer.kernel is not None and torch.equal(layer(x), layer.kernel(x, layer.prepared))
    layer.to("cpu").half()
    assert _state_ids(layer) == {id(b) for b in layer.buffers()}
    other = QuantLinear(GPTQ4, _linear(seed=5))
    other.load_state_dict(layer.state_dict())
    assert _state_ids(other) == {id(b) for b in other.buffers()} and torch.equal(other(x), layer(x))


def test_the_checkpoint_is_validated_once_by_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once where the tensors enter the module, once where they enter the kernel
    (``prepare`` validates: engines call it directly)."""
    calls: list[Any] = []
    inner = GPTQ.validate

    def counting(self: GPTQ, tensors: Any) -> dict[str, int]:
        calls.append(1)
        return inner(self, tensors)

    monkeypatch.setattr(GPTQ, "validate", counting)
    layer = QuantLinear(GPTQ4, _linear())
    assert layer.kernel is not None and layer.kernel.name == "aten_cpu"
    assert len(calls) == 2
