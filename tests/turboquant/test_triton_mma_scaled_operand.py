"""The tensor-core kernel with the group scale in its register operand
(``MmaConfig.scaled_operand``: ŵ = centroid · scale rounded once to x's dtype, the dot
accumulating into the output tile) under the interpreter:

* against the float64 golden output at the conformance tolerance of x's dtype (bf16 and
  fp16), one pass and two, shared and own rotations and a rotation per group, x rotated
  outside, in the kernel and once by the launch's rotation programs, one split and two;
* bit for bit the unscaled register operand when every c · s is exact in x's dtype and
  every product and sum exact (a dyadic codebook, power-of-two scales, integer
  activations, signed-permutation rotations): what is compared is then the rest — the
  scale of each row and group reaching the right weights, the accumulation into the tile;
* off, or on where the register operand is not used, the kernel is the unscaled one
  (the ``SCALED`` constexpr is off) and gives the same bits.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.ops.linear import linear_reference

from ..interpreting import INTERPRETER, NOT_INTERPRETED
from .register_operand_cases import LAYERS, PLANS, ROUTES, D, K, N, exact_layer, layer

pytestmark = pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _config(where: str, gpc: int, *, register: bool = True, scaled: bool = True) -> Any:
    from quantcore.backends.turboquant_triton.configs import MmaConfig

    # 2 warps: one warpgroup's 16 rows a warp fit 32 rows (fused.py uses the register operand only then).
    return MmaConfig(block_n=32, block_m=16, gpc=gpc, warps=2, ctas=1000, rotate_in_kernel=where == "kernel",
                     rotate_once=where == "once", register_operand=register, scaled_operand=scaled)


def _call(prep: Any, x: torch.Tensor, cfg: Any, *, out_dtype: torch.dtype, bias: bool = True,
          partial: torch.Tensor | None = None, d: int = D) -> torch.Tensor:
    from quantcore.backends.turboquant_triton.fused import fused_linear

    return fused_linear(x, prep.passes, prep.codebook, group_size=d, partial=partial,
                        bias=prep.bias if bias else None, out_dtype=out_dtype, path="mma", config=cfg)


@pytest.fixture(autouse=True)
def _no_rotation_override(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.backends.turboquant_triton.configs import ROTATION_ENV

    monkeypatch.delenv(ROTATION_ENV, raising=False)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(LAYERS))
def test_scaled_operand_meets_the_golden(name: str, dtype: str) -> None:
    x_dtype = DTYPES[dtype]
    fmt, t, prep = layer(name, seed=31, dtype=x_dtype)
    gen = torch.Generator().manual_seed(32)
    m = 17  # two row tiles, the second one row
    x = torch.randn(m, K, generator=gen).to(x_dtype)
    partial = torch.randn(m, N, generator=gen)
    golden = linear_reference(x, fmt.dequantize(t), None)
    for where in ROUTES[name]:
        for gpc, bias, with_partial in PLANS:
            ref = golden + (t["bias"].double() if bias else 0) + (partial.double() if with_partial else 0)
            y = _call(prep, x, _config(where, gpc), out_dtype=x_dtype, bias=bias,
                      partial=partial if with_partial else None)
            result = compare(y, ref, tolerance_for(x_dtype))
            assert result.ok, f"{name} {dtype} {where} gpc={gpc}: {result.problem}"


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", ["one-pass", "own-rotations"])
def test_bit_identical_to_the_unscaled_operand_when_exact(name: str, dtype: str) -> None:
    x_dtype = DTYPES[dtype]
    _, _, prep = layer(name, seed=41, dtype=x_dtype)
    gen = torch.Generator().manual_seed(42)
    exact = exact_layer(prep, gen, x_dtype, power_of_two_scales=True)
    m = 17
    x = torch.randint(-8, 9, (m, K), generator=gen).to(x_dtype)
    partial = torch.randn(m, N, generator=gen)
    for where in ROUTES[name]:
        for gpc, bias, with_partial in PLANS:
            part = partial if with_partial else None
            new, old = (_call(exact, x, _config(where, gpc, scaled=flag), out_dtype=torch.float32, bias=bias,
                              partial=part) for flag in (True, False))
            assert old.abs().max() > 0, "a zero output compares nothing"
            assert torch.equal(new, old), f"{name} {where} gpc={gpc}: {(new - old).abs().max()}"


def _bucket_constexprs(prep: Any, cfg: Any, d: int = D) -> dict[str, Any]:
    from quantcore.backends.turboquant_triton.fused import _Mma

    return _Mma(16, torch.bfloat16, prep.passes, prep.codebook, d, False, None, torch.device("cpu"), cfg).constexprs


def test_off_or_without_the_register_operand_the_kernel_is_the_unscaled_one() -> None:
    _, _, prep = layer("one-pass", seed=51, dtype=torch.bfloat16)
    assert _bucket_constexprs(prep, _config("outside", 4))["SCALED"] is True
    assert _bucket_constexprs(prep, _config("outside", 4, scaled=False))["SCALED"] is False
    assert _bucket_constexprs(prep, _config("outside", 4, register=False))["SCALED"] is False
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(52)).to(torch.bfloat16)
    # The shared-memory operand ignores the flag: the same bits with it on and off.
    new, old = (_call(prep, x, _config("outside", 3, register=False, scaled=flag), out_dtype=torch.float32)
                for flag in (True, False))
    assert old.abs().max() > 0 and torch.equal(new, old)


def test_below_the_smallest_group_the_flag_is_ignored() -> None:
    _, _, prep = layer("one-pass", seed=53, dtype=torch.bfloat16, d=32)
    assert _bucket_constexprs(prep, _config("outside", 3), d=32)["SCALED"] is False
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(54)).to(torch.bfloat16)
    new, old = (_call(prep, x, _config("outside", 3, scaled=flag), out_dtype=torch.float32, d=32)
                for flag in (True, False))
    assert old.abs().max() > 0 and torch.equal(new, old)
