"""The tensor-core kernel with its weight operand made in the register layout
(``MmaConfig.register_operand``, ``operand.py``) under the interpreter:

* against the golden output, one pass and two, shared and own rotations and a rotation per
  group, x rotated outside, in the kernel and once by the launch's rotation programs;
* bit for bit the shared-memory operand when every product and sum is exact (a dyadic
  codebook, integer activations, signed-permutation rotations): then the only difference
  between the two, the order of the sum over a group, cannot show, and what is compared
  is the rest — the coordinate order of x on every rotation route, the codes' nibbles,
  the scales, the splits, the passes, bias and partial;
* below d = 64 the flag is ignored (the shared-memory operand).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.kernels.turboquant.rotation import InputRotation
from quantcore.ops.linear import linear_reference

from ..interpreting import INTERPRETER, NOT_INTERPRETED
from .register_operand_cases import LAYERS, PLANS, ROUTES, D, K, N, exact_layer, layer

pytestmark = pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)


def _call(prep: Any, x: torch.Tensor, where: str, gpc: int, register: bool, *, out_dtype: torch.dtype,
          bias: bool = True, partial: torch.Tensor | None = None, d: int = D) -> torch.Tensor:
    from quantcore.backends.turboquant_triton.configs import MmaConfig
    from quantcore.backends.turboquant_triton.fused import fused_linear

    # 2 warps: fused.py makes the register operand only with 16 rows a warp (32 rows: 2 warps).
    cfg = MmaConfig(block_n=32, block_m=16, gpc=gpc, warps=2, ctas=1000, rotate_in_kernel=where == "kernel",
                    rotate_once=where == "once", register_operand=register)
    return fused_linear(x, prep.passes, prep.codebook, group_size=d, partial=partial,
                        bias=prep.bias if bias else None, out_dtype=out_dtype, path="mma", config=cfg)


@pytest.mark.parametrize("m", [3, 33])
@pytest.mark.parametrize("name", list(LAYERS))
def test_register_operand_meets_the_golden(monkeypatch: pytest.MonkeyPatch, name: str, m: int) -> None:
    from quantcore.backends.turboquant_triton.configs import ROTATION_ENV

    monkeypatch.delenv(ROTATION_ENV, raising=False)
    fmt, t, prep = layer(name, seed=m)
    gen = torch.Generator().manual_seed(400 + m)
    x = torch.randn(m, K, generator=gen).to(torch.bfloat16)
    partial = torch.randn(m, N, generator=gen)
    golden = linear_reference(x, fmt.dequantize(t), None)
    for where in ROUTES[name]:
        for gpc, bias, with_partial in PLANS:
            ref = golden + (t["bias"].double() if bias else 0) + (partial.double() if with_partial else 0)
            y = _call(prep, x, where, gpc, True, out_dtype=torch.bfloat16, bias=bias,
                      partial=partial if with_partial else None)
            result = compare(y, ref, tolerance_for(torch.bfloat16))
            assert result.ok, f"{name} {where} M={m} gpc={gpc}: {result.problem}"


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_bit_identical_to_the_shared_memory_operand_when_exact(monkeypatch: pytest.MonkeyPatch, name: str,
                                                               x_dtype: torch.dtype) -> None:
    from quantcore.backends.turboquant_triton.configs import ROTATION_ENV

    monkeypatch.delenv(ROTATION_ENV, raising=False)
    _, _, prep = layer(name, seed=21)
    gen = torch.Generator().manual_seed(22)
    exact = exact_layer(prep, gen, x_dtype)
    for m in (2, 17):
        x = torch.randint(-8, 9, (m, K), generator=gen).to(x_dtype)
        partial = torch.randn(m, N, generator=gen)
        for where in ROUTES[name]:
            for gpc, bias, with_partial in PLANS:
                part = partial if with_partial else None
                new, old = (_call(exact, x, where, gpc, flag, out_dtype=torch.float32, bias=bias, partial=part)
                            for flag in (True, False))
                assert old.abs().max() > 0, "a zero output compares nothing"
                assert torch.equal(new, old), f"{name} {where} M={m} gpc={gpc}: {(new - old).abs().max()}"


def test_below_the_smallest_group_the_flag_keeps_the_shared_memory_operand() -> None:
    fmt, t, prep = layer("one-pass", seed=5, d=32)
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    new, old = (_call(prep, x, "outside", 3, flag, out_dtype=torch.float32, d=32) for flag in (True, False))
    assert torch.equal(new, old)
    result = compare(new.to(torch.bfloat16), linear_reference(x, fmt.dequantize(t), t["bias"]),
                     tolerance_for(torch.bfloat16))
    assert result.ok, result.problem


@pytest.mark.parametrize("per_group", [False, True])
def test_input_rotation_columns_permute_each_group_exactly(per_group: bool) -> None:
    from quantcore.backends.turboquant_triton.operand import coordinate_order

    gen = torch.Generator().manual_seed(9)
    r = K // D if per_group else 1
    rotations = [torch.randn(r, D, D, generator=gen).to(torch.bfloat16) for _ in range(2)]
    x = torch.randn(5, K, generator=gen).to(torch.bfloat16)
    order = coordinate_order(D)
    assert sorted(order.tolist()) == list(range(D)) and order[1] == 4 and order[D // 4] == 1
    for rots in (rotations[:1], rotations):
        plain = InputRotation(rots)(x).view(5, K // D, len(rots), D)
        permuted = InputRotation(rots, columns=order)(x).view(5, K // D, len(rots), D)
        assert torch.equal(permuted, plain[..., order])
    with pytest.raises(ValueError, match="permutation"):
        InputRotation(rotations[:1], columns=torch.zeros(D, dtype=torch.long))
