"""The tensor-core kernel rotating x once per call inside its own launch (``mma.py``,
``ROTATE_ONCE``) under the interpreter:

* bit for bit the default path (the rotation GEMM outside, then the kernel) when the
  rotations are signed permutations — exact in any summation order, so the two rotations
  agree to the bit and what is compared is everything after them: the workspace's
  layout, the row tiles, the splits, the passes, the bias;
* bit for bit the in-kernel rotation (``ROTATE``) with the format's rotations (the same
  dot on the same operands), within float32 tolerance of the default path, and within
  the activation dtype's tolerance of the golden output;
* the counts that join the rotation programs and the output tiles are back at 0 after
  every call, and a count left over makes the result NaN instead of stale.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.linear import linear_reference

from ..interpreting import INTERPRETER, NOT_INTERPRETED
from .test_triton_mma_rotation import ROTATED_IN_KERNEL, D, K, N, _dequantized, _layer

pytestmark = pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)

#: (groups a program, block_m): one split; 3 splits of 3, 3 and 2 groups on 16-row tiles.
PLANS = [(8, 16), (3, 16)]


def _signed_permutation(gen: torch.Generator) -> torch.Tensor:
    """Π [1, d, d]: an orthogonal matrix whose products with x are exact in any order."""
    perm = torch.randperm(D, generator=gen)
    signs = torch.randint(0, 2, (D,), generator=gen) * 2 - 1
    pi = torch.zeros(D, D)
    pi[torch.arange(D), perm] = signs.float()
    return pi[None]


def _with_rotations(prep: Any, fmt: TurboQuant, pis: list[torch.Tensor], dtype: torch.dtype) -> Any:
    """``prep`` with pass p rotated by ``pis[p]`` (handed to the kernel as P = Πᵀ in
    ``dtype``); passes that shared one rotation tensor still share one."""
    ps = [pi.transpose(1, 2).contiguous().to(dtype) for pi in pis]
    shared = len(prep.passes) == 2 and prep.passes[1].rotation is prep.passes[0].rotation
    passes = [dataclasses.replace(p, rotation=ps[0 if shared else i]) for i, p in enumerate(prep.passes)]
    return dataclasses.replace(prep, passes=tuple(passes))


def _call(prep: Any, x: torch.Tensor, where: str, gpc: int, block_m: int, *, out_dtype: torch.dtype,
          partial: torch.Tensor | None = None, bias: bool = True) -> torch.Tensor:
    from quantcore.backends.turboquant_triton.configs import MmaConfig
    from quantcore.backends.turboquant_triton.fused import fused_linear

    cfg = MmaConfig(block_n=32, block_m=block_m, gpc=gpc, ctas=1000, rotate_in_kernel=where == "kernel",
                    rotate_once=where == "once")
    return fused_linear(x, prep.passes, prep.codebook, group_size=D, partial=partial,
                        bias=prep.bias if bias else None, out_dtype=out_dtype, path="mma", config=cfg)


def _counts(x: torch.Tensor, prep: Any) -> list[int]:
    from quantcore.backends.turboquant_triton.workspace import rotation_buffers

    return rotation_buffers(x.device, 0, prep.passes[0].rotation.dtype)[1][:2].tolist()


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m", [2, 16, 33])
@pytest.mark.parametrize("name", ROTATED_IN_KERNEL)
def test_once_is_bit_identical_to_the_default_path(monkeypatch: pytest.MonkeyPatch, name: str, m: int,
                                                   x_dtype: torch.dtype) -> None:
    from quantcore.backends.turboquant_triton.configs import ROTATION_ENV

    monkeypatch.delenv(ROTATION_ENV, raising=False)
    fmt, t, prep = _layer(name, seed=m)
    gen = torch.Generator().manual_seed(200 + m)
    pis = [_signed_permutation(gen) for _ in fmt.passes]
    x = torch.randn(m, K, generator=gen).to(x_dtype)
    # float32: the CPU's compute dtype; the activation's: a GPU's
    for rotation_dtype in (torch.float32, x_dtype):
        rotated = _with_rotations(prep, fmt, pis, rotation_dtype)
        shared = name == "shared-rotation"
        ref = linear_reference(x, _dequantized(fmt, t, [pis[0]] * 2 if shared else pis), t["bias"])
        for gpc, block_m in PLANS:
            what = f"{name} M={m} {x_dtype} rotations {rotation_dtype} gpc={gpc}"
            for out_dtype in (x_dtype, torch.float32):
                once, default = (_call(rotated, x, where, gpc, block_m, out_dtype=out_dtype)
                                 for where in ("once", "outside"))
                assert torch.equal(once, default), f"{what} out {out_dtype}: {(once - default).abs().max()}"
            result = compare(once.to(x_dtype), ref, tolerance_for(x_dtype))
            assert result.ok, f"{what}: {result.problem}"
            assert _counts(x, rotated) == [0, 0], what


@pytest.mark.parametrize("m", [2, 33])
@pytest.mark.parametrize("name", ROTATED_IN_KERNEL)
def test_once_rotates_as_the_in_kernel_rotation_and_meets_the_golden(name: str, m: int) -> None:
    fmt, t, prep = _layer(name, seed=50 + m)
    gen = torch.Generator().manual_seed(300 + m)
    x = torch.randn(m, K, generator=gen).to(torch.bfloat16)
    partial = torch.randn(m, N, generator=gen)
    golden = linear_reference(x, fmt.dequantize(t), None)
    for (gpc, block_m), with_partial in zip(PLANS, (False, True), strict=True):
        part = partial if with_partial else None
        ref = golden + t["bias"].double() + (partial.double() if with_partial else 0)
        what = f"{name} M={m} gpc={gpc} partial={with_partial}"
        for out_dtype in (torch.bfloat16, torch.float32):
            once, inside = (_call(prep, x, where, gpc, block_m, out_dtype=out_dtype, partial=part)
                            for where in ("once", "kernel"))
            assert torch.equal(once, inside), f"{what} out {out_dtype}"
        result = compare(once.to(torch.bfloat16), ref, tolerance_for(torch.bfloat16))
        assert result.ok, f"{what}: {result.problem}"
        # The GEMM outside sums the same products in another order.
        default = _call(prep, x, "outside", gpc, block_m, out_dtype=torch.float32, partial=part)
        result = compare(once, default.double(), tolerance_for(torch.float32))
        assert result.ok, f"{what}, once vs outside: {result.problem}"


def test_consecutive_calls_reset_the_counts_and_rotate_their_own_x() -> None:
    fmt, t, prep = _layer("own-rotations", seed=11)
    gen = torch.Generator().manual_seed(12)
    xs = [torch.randn(m, K, generator=gen).to(torch.bfloat16) for m in (20, 20, 5, 20)]
    first = _call(prep, xs[0], "once", 3, 16, out_dtype=torch.float32)
    assert _counts(xs[0], prep) == [0, 0]
    assert torch.equal(_call(prep, xs[0], "once", 3, 16, out_dtype=torch.float32), first)
    for x in xs[1:]:  # other x, other row counts (other numbers of rotation programs and tiles)
        y = _call(prep, x, "once", 3, 16, out_dtype=torch.bfloat16)
        result = compare(y, linear_reference(x, fmt.dequantize(t), t["bias"]), tolerance_for(torch.bfloat16))
        assert result.ok, (x.shape[0], result.problem)
        assert _counts(x, prep) == [0, 0]


def test_a_count_left_over_makes_the_result_nan_not_stale() -> None:
    """What the interpreter checks where the GPU would spin: a count the previous launch
    did not reset (the rotated x could be the previous call's) poisons every tile."""
    from quantcore.backends.turboquant_triton.workspace import rotation_buffers

    _, _, prep = _layer("one-pass", seed=13)
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(14)).to(torch.bfloat16)
    good = _call(prep, x, "once", 8, 16, out_dtype=torch.float32)
    assert good.isfinite().all()
    counts = rotation_buffers(x.device, 0, prep.passes[0].rotation.dtype)[1]
    counts[0] = 1
    bad = _call(prep, x, "once", 8, 16, out_dtype=torch.float32)
    assert bad.isnan().all()
    assert counts[:2].tolist() == [0, 0]  # the launch still resets them
    assert torch.equal(_call(prep, x, "once", 8, 16, out_dtype=torch.float32), good)


@pytest.mark.parametrize("name", ["one-pass", "own-rotations"])
def test_planned_for_a_gpu_the_rotation_programs_come_first(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Planned as on a GPU (launches recorded, not run): the grid is (N tiles, split, z),
    its first z-slices hold at least every (rotation, group, row tile) chunk — the lowest
    linear ids — and the rest one slice per row tile; the default path keeps its grid."""
    from quantcore.backends.turboquant_triton import fused
    from quantcore.backends.turboquant_triton.configs import MmaConfig
    from tests.launch_recorder import record_launches

    recorded = record_launches(monkeypatch, fused)
    monkeypatch.setattr(fused, "interpreting", lambda: False)
    _, _, prep = _layer(name)
    passes = tuple(dataclasses.replace(p, rotation=p.rotation.to(torch.bfloat16)) for p in prep.passes)  # a GPU's
    copies = 2 if name == "own-rotations" else 1
    for m, block_m in ((16, 16), (40, 16), (40, 64)):
        x = torch.randn(m, K).to(torch.bfloat16)
        for once in (True, False):
            cfg = MmaConfig(block_n=16, block_m=block_m, gpc=3, ctas=1000, rotate_once=once)
            fused.fused_linear(x, passes, prep.codebook, group_size=D, partial=None, bias=None,
                               out_dtype=torch.bfloat16, path="mma", config=cfg)
            grid, args = recorded[-1].calls[-1]
            tiles_m, split = -(-m // block_m), 3  # 8 groups, 3 a program
            assert grid[:2] == (N // 16, split) and recorded[-1].constexprs["ROTATE_ONCE"] is once
            if once:
                rotating = args[19]
                assert grid[2] == rotating + tiles_m
                assert (rotating - 1) * grid[0] * grid[1] < copies * (K // D) * tiles_m <= rotating * grid[0] * grid[1]
            else:
                assert grid[2] == tiles_m and args[19] == 0
