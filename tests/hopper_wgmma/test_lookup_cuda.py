"""``hopper_wgmma``'s kernel with the codebook operand (``LOOKUP``) on an sm_90 GPU, over
TurboQuant layers laid out by ``tools/probes/turboquant_hopper.py``: against the float64
golden at the conformance tolerance, and on inputs whose every product and sum is exact,
bit for bit the golden rounded once (which checks the PTX's fields, pairing and scale rows
on the device). The wgmma kernel (the scale in the operand) and the warp-level decode
kernel (the scale on each group's product); one and two passes, bf16 and fp16, M on and
off the tile, split and not, warp-specialised and not. The PTX and the compiled code are checked on any machine
(``test_lookup_operand.py``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantcore.ops.tolerance import compare, tolerance_for

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(not SM90, reason="the codebook operand is Gluon for sm_90 (an H100 or H200)")

K, N = 512, 320
#: The wgmma kernel's plans, and the warp-level decode kernel's (``decode,SPLIT``: 16 rows at most).
PLANS = ["1,8,4,2,in_flight", "1,16,4,2,in_flight", "2,64,4,1,in_flight,ws", "1,128,3,1", "decode,2", "decode,3"]


@pytest.fixture(scope="module", params=[False, True], ids=["one-pass", "residual"])
def layer(request: pytest.FixtureRequest) -> object:
    from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
    from quantcore.formats.turboquant import TurboQuant

    fmt = TurboQuant(bits=4, group_size=128, residual=request.param)
    gen = torch.Generator().manual_seed(11)
    stored = fmt.quantize(torch.randn(N, K, generator=gen) * 0.02, generator=gen)
    return TurboQuantTriton(fmt, "cuda").prepare({k: v.cuda() for k, v in stored.items()}, dtype=torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 13, 64, 130])
@pytest.mark.parametrize("text", PLANS)
def test_the_lookup_operand_gives_the_layers_product(layer: object, text: str, m: int, dtype: torch.dtype) -> None:
    from tools.probes.turboquant_hopper import (
        exact_layer,
        golden_output,
        plan_of_text,
        rotated,
        run,
        tq_to_hopper,
    )

    if text.startswith("decode") and m > 16:
        pytest.skip("the decode kernel multiplies at most 16 rows")
    plan = plan_of_text(text)
    prep = dataclasses.replace(layer, passes=tuple(dataclasses.replace(p, rotation=p.rotation.to(dtype))
                                                   for p in layer.passes))  # type: ignore[attr-defined]
    w = tq_to_hopper(prep)
    x = torch.randn(m, K, device="cuda").to(dtype)
    y = run(rotated(x, prep), w, plan)
    verdict = compare(y, golden_output(x, prep).cpu(), tolerance_for(dtype))
    assert verdict.ok, verdict.problem

    exact, _ = exact_layer(prep, K, m)
    ex_w = tq_to_hopper(exact)
    ex_x = torch.randint(-8, 9, (m, K), device="cuda").to(dtype)
    assert torch.equal(run(rotated(ex_x, exact), ex_w, plan), golden_output(ex_x, exact).to(dtype))
