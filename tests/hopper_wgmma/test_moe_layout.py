"""The ``trtllm_moe`` format's experts in ``hopper_wgmma``'s layout
(``backends/hopper_wgmma/moe_layout.py``): a lossless round trip, the same weight as the
format's golden dequantization, and the asymmetric format refused."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.hopper_wgmma.layout import hopper_to_rows
from quantcore.backends.hopper_wgmma.moe_layout import TRTLLMMoEToHopper
from quantcore.errors import UnsupportedProblemError
from quantcore.formats.trtllm_moe import TRTLLMMoE


def _weights(fmt: TRTLLMMoE, e: int, k: int, n: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"qweight": torch.randint(-128, 128, (e, k, n), dtype=torch.int8, generator=gen),
            "scales": (torch.rand(e, fmt.num_groups(k), n, generator=gen) * 2e-2 + 1e-3).to(fmt.scale_dtype)}


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group,k,n", [(128, 256, 192), (64, 320, 100), (128, 4096, 64)])
def test_round_trip_and_the_same_weight(scale_dtype: torch.dtype, group: int, k: int, n: int) -> None:
    fmt = TRTLLMMoE(group_size=group, sym=True, scale_dtype=scale_dtype)
    src = _weights(fmt, 3, k, n, seed=k + n)
    experts = TRTLLMMoEToHopper(fmt).apply(src)
    assert len(experts) == 3 and all((w.bits, w.in_features, w.out_features) == (8, k, n) for w in experts)
    assert all(w.zeros is None and w.group_map is None for w in experts)  # symmetric, groups in order
    back = TRTLLMMoEToHopper(fmt).invert(experts)
    assert torch.equal(back["qweight"], src["qweight"]) and torch.equal(back["scales"], src["scales"])
    golden = fmt.dequantize(src)  # [E, K, N] float64
    of = torch.arange(k) // group  # each input's group
    for e, w in enumerate(experts):
        rows = hopper_to_rows(w)
        held = (rows.codes.double() - rows.zeros.double()[of].T) * rows.scales.double()[of].T  # [N, K]
        assert torch.equal(held.T, golden[e]), e


def test_the_asymmetric_format_is_refused() -> None:
    fmt = TRTLLMMoE(group_size=128, sym=False, scale_dtype=torch.bfloat16)
    src = _weights(fmt, 2, 256, 64, seed=1)
    src["zeros"] = torch.zeros_like(src["scales"])
    with pytest.raises(UnsupportedProblemError, match="zeros"):
        TRTLLMMoEToHopper(fmt).apply(src)
