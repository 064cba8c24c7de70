"""Every path of ``turboquant_triton`` under the interpreter, forced where the wrapper's
M rule would not pick it: the decode kernel split over K (the ticket that elects the
program adding the splits, reset for the next launch), the tensor-core kernel split over
K, dequantize + GEMM with interleaved passes; a running ``partial`` and the bias; and the
config tables keyed by the full geometry."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.linear import linear_reference

from ..interpreting import INTERPRETER, NOT_INTERPRETED

pytestmark = pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)


def _layer(fmt: TurboQuant, n: int, k: int, seed: int) -> tuple[dict[str, torch.Tensor], object]:
    from quantcore.backends.turboquant_triton import TurboQuantTriton

    gen = torch.Generator().manual_seed(seed)
    t = fmt.quantize(torch.randn(n, k, generator=gen) * 0.05, generator=gen)
    t["bias"] = torch.randn(n, generator=gen)
    kernel = TurboQuantTriton(fmt, "cpu")
    return t, kernel.prepare(t, dtype=torch.bfloat16)


def _check(fmt: TurboQuant, n: int, k: int, m: int, path: str, config: object = None, *,
           with_partial: bool = False, seed: int = 0, calls: int = 1) -> None:
    from quantcore.backends.turboquant_triton.fused import fused_linear

    t, prep = _layer(fmt, n, k, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    partial = torch.randn(m, n, generator=gen) if with_partial else None
    ref = linear_reference(x, fmt.dequantize(t), t["bias"])
    if partial is not None:
        ref = ref + partial.double()
    for call in range(calls):  # a second launch must find the split-K tickets reset
        y = fused_linear(x, prep.passes, prep.codebook, group_size=fmt.group_size, partial=partial,
                         bias=prep.bias, out_dtype=torch.bfloat16, path=path, config=config)
        result = compare(y, ref, tolerance_for(torch.bfloat16))
        assert result.ok, f"call {call}: {result.problem}"


def test_decode_kernel_split_over_k_with_both_passes() -> None:
    from quantcore.backends.turboquant_triton.configs import GemvConfig

    # 16 groups, 4 a program: 4 splits, 2 row chunks; the loop unrolled by 3 over 3 steps.
    _check(TurboQuant(group_size=32, residual=True), 70, 512, 1, "gemv", GemvConfig(gpc=4, ctas=8, br=4, warps=4),
           calls=2)


def test_decode_kernel_ragged_last_split_with_partial() -> None:
    from quantcore.backends.turboquant_triton.configs import GemvConfig

    # 10 groups, 4 a program: the last split holds 2 (masked groups, clamped scales).
    _check(TurboQuant(group_size=64), 70, 640, 1, "gemv", GemvConfig(gpc=4, ctas=9, br=16, warps=4, unroll=1),
           with_partial=True)


@pytest.mark.parametrize("lookup", ["pairs", "half_pairs"])
@pytest.mark.parametrize("residual", [False, True], ids=["one-pass", "residual"])
def test_decode_kernel_with_paired_lookups(residual: bool, lookup: str) -> None:
    """Both indices of a byte looked up at once (pairs.py). The interpreter runs the
    kernel's paired plumbing with plain loads (fp16-rounded centroids for ``half_pairs``);
    the PTX lookups are checked on the GPU (tests/turboquant/test_cuda_gemv_pairs.py)."""
    from quantcore.backends.turboquant_triton.configs import GemvConfig

    _check(TurboQuant(group_size=64, residual=residual), 70, 640, 1, "gemv",
           GemvConfig(gpc=4, ctas=9, br=8, warps=4, unroll=1, lookup=lookup), with_partial=True, calls=2)


@pytest.mark.parametrize(("group", "k", "gpc", "br", "residual"), [
    (128, 1024, 8, 16, False),  # the 4096 x 14336 plan's tile: 16 rows x 128 words
    (64, 640, 4, 8, True),      # 10 groups, 4 a program: the last split's second half masked
    (64, 1280, 8, 4, False),
], ids=["16x128", "ragged-residual", "8-groups"])
def test_decode_kernel_reading_whole_sectors_computes_the_same(group: int, k: int, gpc: int, br: int,
                                                               residual: bool) -> None:
    """``halves`` (gemv._word_columns): each thread's two vectors of index words from the two
    halves of a row. The same products, each vector with its own group's scale; only the
    vectors are summed in another order. Against the golden, and within float32 rounding
    of the plain walk (a vector given another group's scale or plane would be far off)."""
    from quantcore.backends.turboquant_triton.configs import GemvConfig
    from quantcore.backends.turboquant_triton.fused import fused_linear

    fmt = TurboQuant(group_size=group, residual=residual)
    t, prep = _layer(fmt, 40, k, seed=k)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k + 1)).to(torch.bfloat16)
    plain, halves = (GemvConfig(gpc=gpc, ctas=9, br=br, warps=4, unroll=1, halves=flag) for flag in (False, True))
    ys = [fused_linear(x, prep.passes, prep.codebook, group_size=group, partial=None, bias=prep.bias,
                       out_dtype=torch.float32, path="gemv", config=cfg) for cfg in (plain, halves)]
    assert torch.allclose(ys[1], ys[0], rtol=1e-5, atol=1e-6), (ys[1] - ys[0]).abs().max()
    ref = linear_reference(x, fmt.dequantize(t), t["bias"])
    assert compare(ys[1].to(torch.bfloat16), ref, tolerance_for(torch.bfloat16)).ok


def test_paired_lookups_need_four_warps_and_a_known_name() -> None:
    from quantcore.backends.turboquant_triton.configs import GemvConfig

    with pytest.raises(ValueError, match="at least 4 warps"):
        GemvConfig(warps=2, lookup="pairs")
    with pytest.raises(ValueError, match="lookup expected one of"):
        GemvConfig(lookup="quads")


def test_a_codebook_outside_fp16_takes_the_float32_pairs() -> None:
    from quantcore.backends.turboquant_triton.fused import _lookup
    from quantcore.backends.turboquant_triton.pairs import half_codebook

    cpu = torch.device("cpu")
    standard = TurboQuant(group_size=64).quantize(torch.randn(4, 64))["codebook"]
    assert half_codebook(standard) and _lookup("half_pairs", standard, cpu) == "half_pairs"
    for bad in (1e5, 1e-6):  # above fp16's largest value, below its smallest normal one
        odd = standard.clone()
        odd[3] = bad
        assert not half_codebook(odd) and _lookup("half_pairs", odd, cpu) == "pairs"
    assert _lookup("pairs", standard, cpu) == "pairs" and _lookup("single", standard, cpu) == "single"


def test_decode_kernel_with_a_rotation_per_group() -> None:
    _check(TurboQuant(group_size=64, rotation_per_group=True, residual=True), 48, 256, 1, "gemv")


@pytest.mark.parametrize("residual", [False, True], ids=["one-pass", "residual"])
def test_decode_prerotate_plan_is_bit_identical_to_the_fused_rotation(residual: bool) -> None:
    """The ``prerotate`` plan (the shared rotation once per call, gemv.rotate_kernel) gives
    the decode kernel the very rows its programs would compute: the same output bits, with
    a ragged last split (10 groups, 4 a program) and more than 16 groups (two rotation
    programs)."""
    from quantcore.backends.turboquant_triton.configs import GemvConfig
    from quantcore.backends.turboquant_triton.fused import fused_linear

    for k, gpc in ((640, 4), (1280, 8)):
        fmt = TurboQuant(group_size=64, residual=residual)
        t, prep = _layer(fmt, 40, k, seed=k)
        x = torch.randn(1, k, generator=torch.Generator().manual_seed(k + 1)).to(torch.bfloat16)
        fused, pre = (GemvConfig(gpc=gpc, ctas=9, br=8, warps=4, unroll=1, prerotate=flag) for flag in (False, True))
        # float32 out: a rotation off by one ulp anywhere would show
        ys = [fused_linear(x, prep.passes, prep.codebook, group_size=64, partial=None, bias=prep.bias,
                           out_dtype=torch.float32, path="gemv", config=cfg) for cfg in (fused, pre)]
        assert torch.equal(ys[0], ys[1]), (k, gpc)
        ref = linear_reference(x, fmt.dequantize(t), t["bias"])
        assert compare(ys[1].to(torch.bfloat16), ref, tolerance_for(torch.bfloat16)).ok


def test_tensor_core_kernel_split_over_k_with_partial() -> None:
    from quantcore.backends.turboquant_triton.configs import MmaConfig

    _check(TurboQuant(group_size=64), 70, 640, 20, "mma", MmaConfig(block_n=32, block_m=16, gpc=2, ctas=100),
           with_partial=True, calls=2)


def test_tensor_core_kernel_two_passes_at_m1() -> None:
    from quantcore.backends.turboquant_triton.configs import MmaConfig

    _check(TurboQuant(group_size=32, residual=True), 40, 256, 1, "mma", MmaConfig(block_n=32, block_m=16, gpc=3, ctas=40))


@pytest.mark.parametrize("fmt", [TurboQuant(group_size=64, residual=True),
                                 TurboQuant(group_size=64, rotation_per_group=True, residual=True)],
                         ids=lambda f: f.slug)
def test_dequantize_then_gemm_with_interleaved_passes(fmt: TurboQuant) -> None:
    _check(fmt, 72, 256, 5, "dequant", with_partial=True)


@pytest.mark.parametrize("fmt", [TurboQuant(group_size=64), TurboQuant(group_size=64, residual=True),
                                 TurboQuant(group_size=32, rotation_per_group=True, residual=True)],
                         ids=lambda f: f.slug)
@pytest.mark.parametrize("with_partial", [False, True], ids=["plain", "partial"])
def test_rotation_folded_into_the_weight_then_gemm(fmt: TurboQuant, with_partial: bool) -> None:
    # 70 rows: a ragged last 64-row program; the partial takes the float32 epilogue
    _check(fmt, 70, 256, 5, "fold", with_partial=with_partial)


def _folded_reference(passes: list, codebook: torch.Tensor, n: int, k: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    """Σ_p Ŵ_p · P_pᵀ per group in float64, from the prepared tensors in plain torch:
    Ŵ_p = centroid · scale in float32, rounded to ``dtype`` (nearest even): [n, k/d, d]."""
    groups = k // d
    want = torch.zeros(n, groups, d, dtype=torch.float64)
    for data in passes:
        packed = data.indices.long()
        idx = torch.stack([packed & 15, packed >> 4], dim=-1).view(n, k)  # coordinate 2j: low nibble
        w_hat = (codebook.float()[idx] * data.scales.float().repeat_interleave(d, dim=1)).to(dtype)
        rot = data.rotation.double()
        rot = rot.expand(groups, d, d) if rot.shape[0] == 1 else rot
        want += torch.einsum("ngj,gij->ngi", w_hat.double().view(n, groups, d), rot)
    return want


@pytest.mark.parametrize("per_group", [True, False], ids=["rotation-per-group", "shared-rotation"])
@pytest.mark.parametrize("groups_per_program", [1, 2, 4, "persistent"])
def test_folded_weight_is_every_pass_rotated_back(per_group: bool, groups_per_program: int | str) -> None:
    """``W_eff`` equals Σ_p Ŵ_p · P_pᵀ per group, Ŵ_p rounded to the compute dtype first
    (float32 rotations here, so only the order of the d-term sums differs), however many
    groups a program writes, and with programs that walk every tile (24 rows of 16-row
    tiles: the last row block ragged; 8 tiles over 4 programs or 6 over 5)."""
    from quantcore.backends.turboquant_triton.configs import FoldConfig
    from quantcore.backends.turboquant_triton.fused import _Folded

    fmt = TurboQuant(group_size=32, rotation_per_group=per_group, residual=True)
    _, prep = _layer(fmt, 24, 128, 4)
    passes = [dataclasses.replace(p, rotation=p.rotation.float()) for p in prep.passes]
    want = _folded_reference(passes, prep.codebook, 24, 128, 32, torch.float32)
    if groups_per_program == "persistent":
        config = FoldConfig(block_n=16, warps=4, persistent=1 if per_group else 2)  # 4 or 8 programs
    else:
        config = FoldConfig(groups=int(groups_per_program))
    folded = _Folded(passes, prep.codebook, 32, None, torch.device("cpu"), torch.float32, config)
    if config.persistent:
        assert folded.grid[0] == min(8, 4 * config.persistent) and folded.iters == -(-8 // folded.grid[0])
    else:
        assert folded.grid[1] == 4 // config.groups
    got = folded.fold(torch.empty(24, 128)).view(24, 4, 32)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", [TurboQuant(group_size=64, residual=True),
                                 TurboQuant(group_size=64, rotation_per_group=True)], ids=lambda f: f.slug)
def test_register_operand_fold_is_every_pass_rotated_back(fmt: TurboQuant) -> None:
    """The register-operand fold (Ŵ's columns and Pᵀ's rows in the operand's coordinate
    order, bf16 operands) writes the same W_eff: within a bf16 rounding of the float64 sum,
    as the shared-memory fold is (a permutation applied to one side only would not be)."""
    from quantcore.backends.turboquant_triton.configs import FoldConfig
    from quantcore.backends.turboquant_triton.fused import _Folded

    _, prep = _layer(fmt, 40, 256, 6)
    passes = [dataclasses.replace(p, rotation=p.rotation.to(torch.bfloat16)) for p in prep.passes]
    want = _folded_reference(passes, prep.codebook, 40, 256, 64, torch.bfloat16)
    for config in (FoldConfig(), FoldConfig(block_n=64, warps=4, groups=2, register_operand=True),
                   FoldConfig(block_n=64, warps=4, persistent=1, register_operand=True)):
        folded = _Folded(passes, prep.codebook, 64, None, torch.device("cpu"), torch.bfloat16, config)
        got = folded.fold(torch.empty(40, 256, dtype=torch.bfloat16)).view(40, 4, 64)
        torch.testing.assert_close(got.double(), want, rtol=2 ** -8, atol=1e-5)


def test_interleaved_scratch_layout() -> None:
    """Group g of pass p sits at columns (g·P + p)·d: the scratch equals each pass's
    dequantization in the rotated basis, interleaved per group."""
    from quantcore.backends.turboquant_triton.fused import dequantize_rotated

    fmt = TurboQuant(group_size=32, residual=True)
    t, prep = _layer(fmt, 24, 128, 3)
    w_cat = dequantize_rotated(prep.passes, prep.codebook, 32, torch.float32)
    from quantcore.formats.turboquant.format import unpack_indices

    for p, prefix in enumerate(fmt.passes):
        idx = unpack_indices(t[prefix + "indices"])
        want = t["codebook"][idx] * (t[prefix + "norms"].float() / 32 ** 0.5).repeat_interleave(32, dim=1)
        got = w_cat.view(24, 4, 2, 32)[:, :, p, :].reshape(24, 128)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_wrong_path_and_pass_count_are_refused() -> None:
    from quantcore.backends.turboquant_triton.fused import fused_linear

    _, prep = _layer(TurboQuant(group_size=64), 16, 128, 0)
    x = torch.randn(2, 128).to(torch.bfloat16)
    with pytest.raises(ValueError, match="M = 1"):
        fused_linear(x, prep.passes, prep.codebook, group_size=64, partial=None, bias=None,
                     out_dtype=torch.bfloat16, path="gemv")
    with pytest.raises(ValueError, match="path"):
        fused_linear(x, prep.passes, prep.codebook, group_size=64, partial=None, bias=None,
                     out_dtype=torch.bfloat16, path="fast")
    with pytest.raises(ValueError, match="two passes"):
        fused_linear(x, prep.passes * 3, prep.codebook, group_size=64, partial=None, bias=None,
                     out_dtype=torch.bfloat16)


def test_wide_groups_with_two_passes_are_never_folded() -> None:
    """Groups wider than 128 columns take the dequantization path at every M, and an
    explicit fold of two such passes is refused (its operands would not fit an SM)."""
    from quantcore.backends.turboquant_triton.configs import FOLD_MAX_GROUP, PathChoice
    from quantcore.backends.turboquant_triton.fused import fused_linear

    choice = PathChoice()
    big = 2 * choice.fold_from_m_one_pass
    assert choice.prefill_path(big, 2, FOLD_MAX_GROUP) == choice.prefill_path(big, 1, FOLD_MAX_GROUP) == "fold"
    assert choice.prefill_path(big, 2, 2 * FOLD_MAX_GROUP) == choice.prefill_path(big, 1, 256) == "dequant"
    _, prep = _layer(TurboQuant(group_size=256, residual=True), 8, 256, 0)
    x = torch.randn(2, 256).to(torch.bfloat16)
    with pytest.raises(ValueError, match="at most 128 columns with two passes"):
        fused_linear(x, prep.passes, prep.codebook, group_size=256, partial=None, bias=None,
                     out_dtype=torch.bfloat16, path="fold")


def test_config_tables_key_the_whole_geometry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.backends.turboquant_triton import configs
    from quantcore.probe.card import CardKey

    dev = CardKey("sm_89", 128, 99, 1)  # an architecture no shipped table has
    entries = [
        {"kernel": "gemv", "K": 4096, "N": 4096, "d": 128, "passes": 1, "dtype": "bfloat16",
         "config": {"gpc": 4, "ctas": 99, "br": 8, "warps": 8, "unroll": 1}},
        {"kernel": "mma", "K": 4096, "N": 4096, "d": 128, "passes": 1, "dtype": "bfloat16",
         "m_bucket": 16, "config": {"block_n": 32, "block_m": 16, "gpc": 2, "warps": 4, "stages": 2, "ctas": 7}},
        {"kernel": "gemv", "K": 4096, "N": 14336, "d": 128, "passes": 1, "dtype": "float16",
         "config": {"gpc": 4, "ctas": 55, "br": 8, "warps": 8, "unroll": 1}},
        {"kernel": "gemv", "K": 4096, "N": 14336, "d": 128, "passes": 1, "dtype": "bfloat16",
         "config": {"gpc": 4, "ctas": 77, "br": 8, "warps": 8, "unroll": 1}},
        {"kernel": "paths", "config": {"gemv_max_m": 1, "mma_max_m": 64}},
    ]
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"card": dataclasses.asdict(dev), "entries": entries}))
    monkeypatch.setenv(configs.ENV, str(path))
    assert configs.gemv_config(dev, 4096, 4096, 128, 1, torch.bfloat16).ctas == 99
    # fp16 has the bf16 entry's geometry (the same bytes and registers); float32 does not.
    assert configs.gemv_config(dev, 4096, 4096, 128, 1, torch.float16).ctas == 99
    assert configs.mma_config(dev, 9, 4096, 4096, 128, 1, torch.float16).ctas == 7
    # A dtype's own entry wins over its twin's.
    assert configs.gemv_config(dev, 4096, 14336, 128, 1, torch.float16).ctas == 55
    assert configs.gemv_config(dev, 4096, 14336, 128, 1, torch.bfloat16).ctas == 77
    # Another group size, pass count, dtype width, shape or architecture: not this entry.
    other = CardKey("sm_80", 108, 163, 2)
    for args in ((dev, 4096, 4096, 64, 1, torch.bfloat16), (dev, 4096, 4096, 128, 2, torch.bfloat16),
                 (dev, 4096, 4096, 128, 1, torch.float32), (dev, 4096, 14336, 128, 1, torch.bfloat16),
                 (other, 4096, 4096, 128, 1, torch.bfloat16), (None, 4096, 4096, 128, 1, torch.bfloat16)):
        assert configs.gemv_config(*args).ctas != 99, args
    assert configs.mma_config(dev, 9, 4096, 4096, 128, 1, torch.bfloat16).ctas == 7
    assert configs.mma_config(dev, 17, 4096, 4096, 128, 1, torch.bfloat16).ctas != 7  # M bucket 32
    assert configs.path_for(dev).mma_max_m == 64
    # A card of the same architecture with more SMs takes this table: the nearest of sm_89.
    assert configs.path_for(CardKey("sm_89", 142, 99, 1)).mma_max_m == 64
    assert configs.path_for(other) == configs.PathChoice()


def test_shipped_tables_serve_every_sm90_card() -> None:
    from quantcore.backends.turboquant_triton import configs
    from quantcore.probe.card import key_of_properties
    from quantcore.probe.card_tables import H100_SXM

    tables = configs.tables()
    h100 = tables[H100_SXM]
    # The H200 (3.2 GHz HBM3e on a 6144-bit bus: the 4 TB/s class) has a table of its own.
    h200_key = key_of_properties(SimpleNamespace(major=9, minor=0, multi_processor_count=132,
                                                 shared_memory_per_block_optin=232448, memory_clock_rate=3201000,
                                                 memory_bus_width=6144))
    assert h200_key.bandwidth_class == 4 and h200_key in tables
    h200 = tables[h200_key]
    for shipped in (h100, h200):
        kinds = {k[0] for k in shipped}
        assert {"gemv", "mma", "paths"} <= kinds
        assert all(k[3] == 128 for k in shipped if k[0] != "paths")  # tuned at d = 128 only
    # The cards were tuned apart: the decode configuration of one shape differs.
    key = ("gemv", 4096, 4096, 128, 1, "bfloat16")
    assert configs.gemv_config(h200_key, 4096, 4096, 128, 1, torch.bfloat16) == h200[key] != h100[key]
    # An sm_90 card without a table (an H100 PCIe: 114 SMs, the 2 TB/s class) runs the
    # nearest card's configurations, not the rule's; an A100 (sm_80) the rule's.
    pcie = key_of_properties(SimpleNamespace(major=9, minor=0, multi_processor_count=114,
                                             shared_memory_per_block_optin=232448, memory_clock_rate=1593000,
                                             memory_bus_width=5120))
    a100 = key_of_properties(SimpleNamespace(major=8, minor=0, multi_processor_count=108,
                                             shared_memory_per_block_optin=166912, memory_clock_rate=1593000,
                                             memory_bus_width=5120))
    assert pcie not in tables and configs.table(pcie) in (h100, h200)
    tuned = configs.table(pcie)[("gemv", 4096, 14336, 128, 1, "bfloat16")]
    assert configs.gemv_config(pcie, 4096, 14336, 128, 1, torch.bfloat16) == tuned
    assert configs.gemv_config(None, 4096, 14336, 128, 1, torch.bfloat16) != tuned  # the rule differs here
    assert configs.table(a100) == {}
    assert configs.gemv_config(a100, 4096, 14336, 128, 1, torch.bfloat16) == configs.gemv_config(
        None, 4096, 14336, 128, 1, torch.bfloat16)


def test_decode_rotation_fits_the_cards_shared_memory() -> None:
    """A decode program holds Π [d, d] in shared memory to rotate x: a float32 rotation (a
    layer prepared without a dtype) of d = 256 needs 278,528 B, more than any GPU's 227 KB,
    and raised OutOfResources at the first call on the GPU (found by the kernel fuzz)."""
    from quantcore.backends.turboquant_triton.configs import gemv_rotation_bytes
    from quantcore.backends.turboquant_triton.fused import rotation_fits
    from quantcore.probe.card import CardKey

    assert gemv_rotation_bytes(256, True, "single") == 278_528  # what the H200 refused
    assert gemv_rotation_bytes(128, False, "single") == 36_864  # compiled for sm_90
    h200, bf16, fp32 = CardKey("sm_90", 132, 227, 4), torch.bfloat16, torch.float32
    assert rotation_fits(h200, 128, bf16, fp32, "single") and rotation_fits(h200, 256, bf16, bf16, "pairs")
    assert not rotation_fits(h200, 256, bf16, fp32, "single") and not rotation_fits(h200, 512, bf16, bf16, "single")
    assert not rotation_fits(CardKey("sm_86", 84, 99, 1), 256, bf16, bf16, "single")  # 136 KB over 99
    assert rotation_fits(None, 512, fp32, fp32, "pairs")  # the interpreter


@pytest.mark.parametrize("group_size", [128, 256, 512])
def test_decode_kernel_rotates_outside_where_its_rotation_would_not_fit(
        monkeypatch: pytest.MonkeyPatch, group_size: int) -> None:
    """Over the card's limit x is rotated by a GEMM before the launch: the same answer."""
    from quantcore.backends.turboquant_triton import TurboQuantTriton, fused
    from quantcore.backends.turboquant_triton.configs import GemvConfig
    from quantcore.probe.card import CardKey

    monkeypatch.setattr(fused, "_card", lambda device: CardKey("sm_90", 132, 227, 4))
    fmt = TurboQuant(group_size=group_size)
    k, n = 2 * group_size, 40
    gen = torch.Generator().manual_seed(group_size)
    t = fmt.quantize(torch.randn(n, k, generator=gen) * 0.05, generator=gen)
    prep = TurboQuantTriton(fmt, "cpu").prepare(t)
    assert prep.passes[0].rotation.dtype == torch.float32
    x = torch.randn(1, k, generator=gen).to(torch.bfloat16)
    y = fused.fused_linear(x, prep.passes, prep.codebook, group_size=group_size, partial=None, bias=None,
                           out_dtype=torch.bfloat16, path="gemv",
                           config=GemvConfig(gpc=2, ctas=4, br=8, warps=4, unroll=1))
    bucket = next(b for b in fused.launch_state(prep.codebook).values() if isinstance(b, fused._Gemv))
    assert bucket.shared is (group_size == 128)
    result = compare(y, linear_reference(x, fmt.dequantize(t), None), tolerance_for(torch.bfloat16))
    assert result.ok, result.problem
