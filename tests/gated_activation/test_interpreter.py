"""The gated activation's Triton kernel under Triton's interpreter (``TRITON_INTERPRET=1``,
which the quantcore pytest plugin sets for CPU runs), on fresh random inputs in bf16,
fp16 and fp32, M = 1, 3, 64 rows, and I = 37 and 1100 (neither a multiple of the block:
the last block of every row is masked), every access inside its tensors:

* against the rounding contract bit for bit, with ``exp`` and ``erf`` the interpreter's
  own — the arithmetic (the formulas, their order, both roundings, the halves, the masks)
  is checked exactly;
* against the torch route the op takes on the CPU (what ``act(g) * u`` gives): relu bit for
  bit; silu and gelu within one unit in the last place of the dtype at ``g``'s scale,
  carried through the product, plus what the two libraries' float32 ``exp``/``erf`` may
  differ by (the reason is written at the assertion).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1, set by the quantcore pytest plugin on a CPU run)",
                allow_module_level=True)

from quantcore.kernels.gated_activation import ACTIVATIONS, gated_activation
from quantcore.kernels.gated_activation.triton_launch import run
from tests.interpreter_bounds import bounds_checked

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
#: The interpreter's erf: math.erf in float64, rounded to float32.
_erf32 = np.vectorize(math.erf, otypes=[np.float32])


def _h(m: int, inter: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Gates spread to ±10 or so (the activations' tails), ups around 1."""
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([torch.randn(m, inter, generator=gen) * 3, torch.randn(m, inter, generator=gen)], 1).to(dtype)


def _contract(h: torch.Tensor, activation: str) -> torch.Tensor:
    """The op's rounding contract (quantcore/kernels/gated_activation/op.py) in float32
    torch arithmetic, with ``exp`` and ``erf`` computed as the interpreter computes them."""
    inter = h.shape[-1] // 2
    g, u = h[..., :inter].float(), h[..., inter:].float()
    if activation == "silu":
        a = g / (1 + torch.from_numpy(np.exp(-g.numpy())))  # NumPy's float32 exp
    elif activation == "gelu":
        x = g * torch.tensor(0.7071067811865476, dtype=torch.float32)
        a = g * 0.5 * (1 + torch.from_numpy(_erf32(x.numpy())))
    else:
        a = torch.where(g < 0, 0.0, g)
    return (a.to(h.dtype).float() * u).to(h.dtype)


def _kernel(h: torch.Tensor, activation: str) -> torch.Tensor:
    """The kernel's output, each of its loads and stores checked to lie inside h or out."""
    with bounds_checked() as checked:
        out = run(h, activation)
    assert checked[0] > 0
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(_BITS[a.dtype]), b.view(_BITS[b.dtype]))


def _ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at ``|x|`` (float64), subnormals included."""
    info = torch.finfo(dtype)
    x = x.double().abs()
    _, exp = torch.frexp(x)  # x = m·2^exp, m in [0.5, 1); 0 for x = 0
    spacing = torch.ldexp(torch.full_like(x, info.eps), exp - 1).clamp_min(info.smallest_normal * info.eps)
    return torch.where(x == 0, info.smallest_normal * info.eps, spacing)


@pytest.mark.parametrize("inter", [37, 1100])
@pytest.mark.parametrize("m", [1, 3, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_the_kernel_is_the_rounding_contract_bit_for_bit(activation: str, dtype: torch.dtype, m: int,
                                                         inter: int) -> None:
    h = _h(m, inter, dtype, seed=1000 * m + inter)
    got = _kernel(h, activation)
    want = _contract(h, activation)
    assert got.shape == (m, inter) and got.dtype == dtype
    bad = (got.view(_BITS[dtype]) != want.view(_BITS[dtype])).nonzero()
    assert not len(bad), f"{len(bad)} differ, first at {bad[0].tolist()}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}"


@pytest.mark.parametrize("m", [1, 3, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_the_kernel_matches_the_torch_route(activation: str, dtype: torch.dtype, m: int) -> None:
    inter = 1100
    h = _h(m, inter, dtype, seed=7 * m + 1)
    got, torch_route = _kernel(h, activation), gated_activation(h, activation)
    if activation == "relu":
        assert _same_bits(got, torch_route)  # no exp or erf: the same exact operations
        return
    # Bit for bit is not expected: exp and erf come from NumPy here and from ATen's CPU
    # kernels on the torch route, and two float32 implementations differ in their last
    # bits (a few units at 2⁻²⁴; measured here up to 2⁻²¹·|g| in the activation, ATen's CPU
    # gelu, where 1 + erf(g·√½) cancels near erf = −1 and leaves that difference absolute).
    # So the activations may land on neighbouring values of the dtype: one unit of the
    # dtype at g's scale (|act(g)| ≤ |g|), carried through the product by |u|, plus that
    # float32 difference, bounded at 2⁻¹⁹·|g|, and the product's own rounding.
    g, u = h[:, :inter].double(), h[:, inter:].double()
    bound = u.abs() * (_ulp(g, dtype) + 2.0 ** -19 * g.abs()) + _ulp(torch.maximum(got.abs(), torch_route.abs()), dtype)
    err = (got.double() - torch_route.double()).abs()
    worst = (err / bound).argmax()
    assert (err <= bound).all(), (f"worst at {divmod(int(worst), inter)}: g={g.flatten()[worst].item()} "
                                  f"{got.flatten()[worst].item()} vs {torch_route.flatten()[worst].item()}")


@pytest.mark.filterwarnings("ignore:(overflow|invalid value) encountered:RuntimeWarning")  # NumPy, on inf and NaN
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_infinities_nans_and_the_dtypes_ends_round_as_the_contract(activation: str, dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    gates = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, info.max, -info.max, info.tiny,
                          info.smallest_normal * info.eps, 1.0, -1.0, 20.0, -20.0, 90.0, -90.0, 0.5]).to(dtype)
    ups = torch.tensor([2.0, 3.0, 1.0, 5.0, 7.0, info.max, 4.0, info.tiny, 0.25, info.max, info.max,
                        -math.inf, math.nan, info.max, 1.0, info.smallest_normal * info.eps]).to(dtype)
    h = torch.cat([gates, ups])[None]
    got, want = _kernel(h, activation), _contract(h, activation)
    assert torch.equal(got.isnan(), want.isnan())
    assert _same_bits(got.nan_to_num(0.0), want.nan_to_num(0.0))  # inf, signed zeros, overflow and underflow alike
    nans = gated_activation(h, activation).isnan()
    if activation == "gelu":  # ATen's CPU gelu gives NaN at +inf (its vectorized erf); the formula gives inf
        nans[0, 0] = False
    assert torch.equal(got.isnan(), nans)


def test_rows_of_a_larger_buffer_and_leading_dims_are_read_in_place() -> None:
    buf = _h(9, 40, torch.bfloat16, seed=3)
    rows = buf[2:7, 4:70]  # 5 rows 80 elements apart, I = 33
    assert _same_bits(_kernel(rows, "silu"), _contract(rows, "silu"))
    lead = _h(6, 24, torch.float16, seed=4).view(2, 3, 48)
    assert _same_bits(_kernel(lead, "gelu"), _contract(lead, "gelu"))
