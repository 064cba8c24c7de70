"""Every plan of this card's own table, at the (bits, K, N, M) it was measured at, computes
the float64 golden output in bf16 and fp16 (GPTQ g128 symmetric, as the sweep times it).

The sweep checks each candidate on sampled rows before it times it, but a table is also
edited by hand and merged across runs; this runs what ships, on the card it ships for. An
sm_90 GPU only: on any other machine there is no table of its own to run."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.launch import linear
from quantcore.backends.hopper_wgmma.tuned import load_tables
from quantcore.formats.gptq import GPTQ
from quantcore.ops.linear import linear_reference
from quantcore.ops.tolerance import judge_output
from quantcore.probe.card import card_key

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
#: Output rows compared per call: the first, the last and a random draw (a float64
#: golden of 8192 rows of a 28672-wide layer costs more than the test is worth).
ROWS = 512


def _layer(bits: int, k: int, n: int) -> tuple[object, torch.Tensor]:
    """(the prepared state of a fresh random layer, its float64 weight), both on the GPU."""
    fmt = GPTQ(bits=bits, group_size=128, sym=True)
    gen = torch.Generator(device="cuda").manual_seed(k * 7 + n + bits)
    stored = fmt.quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.02)
    return HopperWgmmaGPTQ(fmt, "cuda").prepare(stored), fmt.dequantize(stored, torch.float64)


@pytest.mark.skipif(not SM90, reason="the tables are for sm_90 cards (an H100 or H200)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_plan_of_this_cards_table_computes_the_golden(dtype: torch.dtype) -> None:
    table = load_tables().get(card_key(torch.device("cuda")))
    if table is None:
        pytest.skip(f"no table ships for this card ({card_key(torch.device('cuda')).slug})")
    wrong = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    layer: tuple[tuple[int, int, int], tuple[object, torch.Tensor]] | None = None
    for (bits, k, n, m), plan in sorted(table.items()):  # each weight shape's plans in a row
        if layer is None or layer[0] != (bits, k, n):
            layer = None  # the last shape's weights go before the next one's are made
            layer = ((bits, k, n), _layer(bits, k, n))
        prepared, dense = layer[1]
        x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        y = linear(x, prepared, plan)
        rows = torch.arange(m, device="cuda")
        if m > ROWS:
            rows = torch.cat([rows[:1], rows[-1:], rows[1:-1][torch.randperm(m - 2, device="cuda", generator=gen)]])
            rows = rows[:ROWS]
        ref = linear_reference(x.index_select(0, rows), dense)
        judged = judge_output(y.index_select(0, rows), ref, dtype)
        if not judged.ok:
            wrong.append(f"{bits}-bit K{k} N{n} M{m} {plan}: {judged.problem}")
    assert not wrong, "\n".join(wrong)
