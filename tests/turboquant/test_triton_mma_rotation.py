"""The tensor-core kernel rotating x itself (``mma.py``, ``ROTATE``) under the interpreter:
against the golden output at several M, one pass and two, the passes' own rotations or
one shared by both, one split and several (ragged), with and without bias and a running
partial; and against the same kernel fed by the rotation GEMM outside. Which variant a
bucket takes (``configs.rotate_in_kernel``: a rotation per group always outside) and how
it is forced."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.errors import InvalidArgumentError
from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.linear import linear_reference
from tests.launch_recorder import record_launches

from ..interpreting import INTERPRETER, NOT_INTERPRETED

pytestmark = pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)

K, N, D = 256, 48, 32  # 8 groups
#: Each layer's passes: (format, pass 2 takes pass 1's rotation tensor).
LAYERS = {
    "one-pass": (TurboQuant(group_size=D), False),
    "own-rotations": (TurboQuant(group_size=D, residual=True), False),
    "shared-rotation": (TurboQuant(group_size=D, residual=True), True),
    "per-group": (TurboQuant(group_size=D, rotation_per_group=True, residual=True), False),
}
#: The layers whose rotation the kernel applies itself (one shared by every group).
ROTATED_IN_KERNEL = ["one-pass", "own-rotations", "shared-rotation"]
#: (groups a program, bias, partial): one split, and 3 splits of 3, 3 and 2 groups.
PLANS = [(8, True, False), (3, False, True), (3, True, True), (8, False, False)]


def _layer(name: str, seed: int = 0) -> tuple[TurboQuant, dict[str, torch.Tensor], Any]:
    """The format, the stored tensors (the golden's input) and the kernel's prepared state."""
    from quantcore.backends.turboquant_triton import TurboQuantTriton

    fmt, shared = LAYERS[name]
    gen = torch.Generator().manual_seed(seed)
    t = fmt.quantize(torch.randn(N, K, generator=gen) * 0.05, generator=gen)
    t["bias"] = torch.randn(N, generator=gen)
    if shared:  # the golden dequantizes pass 2 under the rotation the kernel is handed
        t["residual_rotation"] = t["rotation"].clone()
    prep = TurboQuantTriton(fmt, "cpu").prepare(t, dtype=torch.bfloat16)
    if shared:
        p1, p2 = prep.passes
        prep = dataclasses.replace(prep, passes=(p1, dataclasses.replace(p2, rotation=p1.rotation)))
        assert prep.passes[1].rotation is prep.passes[0].rotation
    return fmt, t, prep


def _dequantized(fmt: TurboQuant, t: dict[str, torch.Tensor], rotations: list[torch.Tensor]) -> torch.Tensor:
    """Ŵ [N, K] in float64 from the spec (docs/formats/turboquant.md: ŵ_g = ‖w‖/√d · Π_gᵀ
    c[idx]) under the rotations given, which need not be orthogonal to the format's
    tolerance (the format's own dequantization checks that)."""
    from quantcore.formats.turboquant.format import unpack_indices

    g = K // D
    w = torch.zeros(N, g, D, dtype=torch.float64)
    for prefix, rotation in zip(fmt.passes, rotations, strict=True):
        y = t["codebook"].double()[unpack_indices(t[prefix + "indices"]).long()].view(N, g, D)
        y = y * (t[prefix + "norms"].double() / D**0.5)[..., None]
        w += torch.einsum("gji,ngj->ngi", rotation.double().expand(g, D, D), y)
    return w.view(N, K)


def _run(prep: Any, x: torch.Tensor, gpc: int, in_kernel: bool, *, bias: bool, partial: torch.Tensor | None,
         out_dtype: torch.dtype, passes: Any = None) -> torch.Tensor:
    from quantcore.backends.turboquant_triton.configs import MmaConfig
    from quantcore.backends.turboquant_triton.fused import fused_linear

    cfg = MmaConfig(block_n=32, block_m=16, gpc=gpc, ctas=1000, rotate_in_kernel=in_kernel)
    return fused_linear(x, passes or prep.passes, prep.codebook, group_size=D, partial=partial,
                        bias=prep.bias if bias else None, out_dtype=out_dtype, path="mma", config=cfg)


@pytest.mark.parametrize("m", [2, 5, 16, 33])
@pytest.mark.parametrize("name", ROTATED_IN_KERNEL)
def test_in_kernel_rotation_matches_the_golden_and_the_outside_rotation(name: str, m: int) -> None:
    fmt, t, prep = _layer(name, seed=m)
    gen = torch.Generator().manual_seed(100 + m)
    x = torch.randn(m, K, generator=gen).to(torch.bfloat16)
    partial = torch.randn(m, N, generator=gen)
    golden = linear_reference(x, fmt.dequantize(t), None)
    for gpc, bias, with_partial in PLANS:
        ref = golden + (t["bias"].double() if bias else 0) + (partial.double() if with_partial else 0)
        part = partial if with_partial else None
        what = f"{name} M={m} gpc={gpc} bias={bias} partial={with_partial}"
        y = _run(prep, x, gpc, True, bias=bias, partial=part, out_dtype=torch.bfloat16)
        result = compare(y, ref, tolerance_for(torch.bfloat16))
        assert result.ok, f"{what}: {result.problem}"
        # float32 out: the two variants compute the same dot products in another order
        y_in, y_out = (_run(prep, x, gpc, flag, bias=bias, partial=part, out_dtype=torch.float32)
                       for flag in (True, False))
        result = compare(y_in, y_out.double(), tolerance_for(torch.float32))
        assert result.ok, f"{what}, in-kernel vs outside: {result.problem}"


def test_in_kernel_rotation_rounds_like_the_outside_gemm_with_16_bit_rotations() -> None:
    """With bf16 rotations (a GPU's compute dtype) the rotated x is rounded to bf16 before
    the weight's dot, as the outside GEMM's bf16 result is: both variants agree to float32
    tolerance (an unrounded x_rot would differ from the outside's by ~2^-9, a hundred
    times that), and both meet the golden output of the bf16 rotations."""
    fmt, t, prep = _layer("own-rotations", seed=7)
    passes = tuple(dataclasses.replace(p, rotation=p.rotation.to(torch.bfloat16)) for p in prep.passes)
    x = torch.randn(16, K, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    # The kernel is handed P = Πᵀ rounded to bf16, that is Π rounded, transposed.
    rounded = [t[prefix + "rotation"].to(torch.bfloat16) for prefix in fmt.passes]
    ref = linear_reference(x, _dequantized(fmt, t, rounded), t["bias"])
    ys = [_run(prep, x, 3, flag, bias=True, partial=None, out_dtype=torch.float32, passes=passes)
          for flag in (True, False)]
    result = compare(ys[0], ys[1].double(), tolerance_for(torch.float32))
    assert result.ok, result.problem
    for y in ys:
        result = compare(y.to(torch.bfloat16), ref, tolerance_for(torch.bfloat16))
        assert result.ok, result.problem


def test_split_k_tickets_are_reset_for_the_next_launch() -> None:
    fmt, t, prep = _layer("own-rotations", seed=3)
    x = torch.randn(20, K, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    ref = linear_reference(x, fmt.dequantize(t), t["bias"])
    for call in range(3):
        y = _run(prep, x, 3, True, bias=True, partial=None, out_dtype=torch.bfloat16)
        result = compare(y, ref, tolerance_for(torch.bfloat16))
        assert result.ok, f"call {call}: {result.problem}"


@pytest.mark.parametrize("name", ["one-pass", "own-rotations", "per-group"])
def test_which_variant_a_bucket_takes(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A shared rotation is applied in the kernel when the config's ``rotate_in_kernel`` is
    True, once by the launch's rotation programs when its ``rotate_once`` is (outside by
    default: faster on the GPU), and the environment overrides both; a rotation per group
    always outside."""
    from quantcore.backends.turboquant_triton import configs
    from quantcore.backends.turboquant_triton.fused import fused_linear

    monkeypatch.delenv(configs.ROTATION_ENV, raising=False)
    per_group = name == "per-group"
    _, _, prep = _layer(name)
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)

    def made(cfg: Any) -> Any:
        fused_linear(x, prep.passes, prep.codebook, group_size=D, partial=None, bias=None,
                     out_dtype=torch.bfloat16, path="mma", config=cfg)
        from quantcore.backends.turboquant_triton import fused

        return next(b for key, b in fused.launch_state(prep.codebook).items() if key[5] == cfg)

    default = made(None)
    assert not default.in_kernel and default.rotate is not None and default.constexprs["ROTATE"] is False
    inside = made(configs.MmaConfig(block_n=32, gpc=2, rotate_in_kernel=True))
    assert (inside.rotate is None) is inside.in_kernel  # no rotation GEMM kept when the kernel rotates
    assert inside.constexprs["ROTATE"] is inside.in_kernel
    assert not made(configs.MmaConfig(block_n=32, rotate_in_kernel=False)).in_kernel
    assert made(configs.MmaConfig(block_n=32, rotate_in_kernel=True)).in_kernel is (not per_group)
    monkeypatch.setenv(configs.ROTATION_ENV, "outside")
    assert not made(configs.MmaConfig(block_n=16, rotate_in_kernel=True)).in_kernel
    monkeypatch.setenv(configs.ROTATION_ENV, "kernel")
    assert made(configs.MmaConfig(block_n=16, gpc=2, rotate_in_kernel=False)).in_kernel is (not per_group)
    monkeypatch.delenv(configs.ROTATION_ENV)
    once = made(configs.MmaConfig(block_n=32, gpc=3, rotate_once=True, rotate_in_kernel=True))
    assert once.once is (not per_group) and not once.in_kernel and (once.rotate is None) is once.once
    assert once.constexprs["ROTATE_ONCE"] is once.once and once.constexprs["ROTATE"] is False
    monkeypatch.setenv(configs.ROTATION_ENV, "once")
    assert made(configs.MmaConfig(block_n=16, gpc=3)).once is (not per_group)
    monkeypatch.setenv(configs.ROTATION_ENV, "outside")
    assert made(configs.MmaConfig(block_n=32, gpc=3, rotate_once=True)).rotation == "outside"
    monkeypatch.setenv(configs.ROTATION_ENV, "inside")
    with pytest.raises(InvalidArgumentError, match=configs.ROTATION_ENV + ".*'outside', 'kernel' or 'once'.*'inside'"):
        configs.rotate_in_kernel(configs.MmaConfig())


def test_the_rule_gives_the_in_kernel_rotation_tiles_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a table entry the tile follows where the rotation runs: outside (the
    default; a rotation per group or float32 operands on a GPU, always) and once the
    measured tiles;
    in the kernel from M = 33 8 warps and 2 stages (4 warps spill with two passes), at
    M = 17-32 2 stages (3-5 need exactly 48 KB with some d = 64 layout)."""
    from quantcore.backends.turboquant_triton import configs

    monkeypatch.delenv(configs.ROTATION_ENV, raising=False)

    def tile(m: int, per_group: bool = False, fp32: bool = False) -> tuple[int, int, int]:
        cfg = configs.mma_config(None, m, 4096, 4096, 128, 2, torch.bfloat16, rotation_per_group=per_group,
                                 fp32_operands=fp32)
        return cfg.block_m, cfg.warps, cfg.stages

    assert tile(64) == tile(64, per_group=True) == tile(64, fp32=True) == (64, 4, 3)
    assert tile(32) == tile(32, per_group=True) == tile(32, fp32=True) == (32, 4, 4)
    assert tile(16) == tile(16, per_group=True) == tile(16, fp32=True) == (16, 4, 3)
    monkeypatch.setenv(configs.ROTATION_ENV, "outside")
    assert tile(64) == (64, 4, 3)
    monkeypatch.setenv(configs.ROTATION_ENV, "kernel")  # never for a rotation per group or in float32
    assert tile(64) == (64, 8, 2) and tile(32) == (32, 4, 2) and tile(16) == (16, 4, 3)
    assert tile(64, per_group=True) == tile(64, fp32=True) == (64, 4, 3)
    assert not configs.rotate_in_kernel(configs.MmaConfig(rotate_in_kernel=True), fp32_operands=True)
    monkeypatch.setenv(configs.ROTATION_ENV, "once")  # its group loop is the outside variant's: its tiles
    assert tile(64) == (64, 4, 3) and tile(32) == (32, 4, 4) and tile(16) == (16, 4, 3)


def test_float32_rotations_stay_outside_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planned as on a GPU (launches recorded, not run): float32 rotations take the GEMM
    outside (Π would take 64 KB of shared memory at d = 128) even where the kernel is asked
    to rotate, in every program or once; under the interpreter, float32 rotations are
    rotated in the kernel."""
    from quantcore.backends.turboquant_triton import fused
    from quantcore.backends.turboquant_triton.configs import ROTATION_ENV

    monkeypatch.setenv(ROTATION_ENV, "kernel")
    _, _, prep = _layer("own-rotations")
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(9))

    def rotation(rotation_dtype: torch.dtype) -> str:
        passes = tuple(dataclasses.replace(p, rotation=p.rotation.to(rotation_dtype)) for p in prep.passes)
        codebook = prep.codebook.clone()  # buckets of their own
        fused.fused_linear(x.to(rotation_dtype), passes, codebook, group_size=D, partial=None, bias=None,
                           out_dtype=rotation_dtype, path="mma")
        (bucket,) = [b for b in fused.launch_state(codebook).values() if isinstance(b, fused._Mma)]
        assert bucket.in_kernel is (bucket.rotation == "kernel")
        return str(bucket.rotation)

    assert rotation(torch.float32) == "kernel"  # the interpreter
    record_launches(monkeypatch, fused)
    monkeypatch.setattr(fused, "interpreting", lambda: False)
    assert rotation(torch.float32) == "outside"
    assert rotation(torch.bfloat16) == rotation(torch.float16) == "kernel"
    monkeypatch.setenv(ROTATION_ENV, "once")  # the same for the rotation once per call
    assert rotation(torch.float32) == "outside"
    assert rotation(torch.bfloat16) == rotation(torch.float16) == "once"
