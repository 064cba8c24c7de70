"""AWQ → GPTQ lanes and back: bit-exact round trips both ways, same dequantization."""

from __future__ import annotations

import pytest
import torch

from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.transforms import AWQToGPTQ, gptq_format_for


def _weight(seed: int = 0) -> torch.Tensor:
    return torch.randn(96, 256, generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize("zero_point", [True, False])
@pytest.mark.parametrize("group_size", [64, -1])
@pytest.mark.parametrize("bias", [False, True])
def test_awq_to_gptq_to_awq(zero_point: bool, group_size: int, bias: bool) -> None:
    fmt = AWQ(group_size=group_size, zero_point=zero_point)
    src = fmt.quantize(_weight())
    if bias:
        src["bias"] = torch.randn(96).half()
    tr = AWQToGPTQ(fmt)
    gptq = tr.apply(src)
    target = gptq_format_for(fmt)
    assert target.sym == (not zero_point)
    target.validate(gptq)
    assert torch.equal(target.dequantize(gptq), fmt.dequantize(src))
    back = tr.invert(gptq)
    assert back.keys() == src.keys()
    assert all(torch.equal(back[k], src[k]) for k in src)


def test_gptq_to_awq_to_gptq() -> None:
    gfmt = GPTQ(bits=4, group_size=32, sym=False)
    src = gfmt.quantize(_weight(1))
    tr = AWQToGPTQ(AWQ(group_size=32, zero_point=True))
    again = tr.apply(tr.invert(src))
    assert all(torch.equal(again[k], src[k]) for k in src)


def test_lane_layouts_differ() -> None:
    """The transform really moves bits: AWQ packs along O in AWQ order, GPTQ along I."""
    fmt = AWQ(group_size=64)
    src = fmt.quantize(_weight())
    gptq = AWQToGPTQ(fmt).apply(src)
    assert src["qweight"].shape == (256, 12) and gptq["qweight"].shape == (32, 96)
    assert not torch.equal(gptq["qzeros"], src["qzeros"])  # nibble order undone
