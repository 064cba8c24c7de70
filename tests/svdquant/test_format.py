"""The svdquant format's golden reference on hand-made vectors: E2M1 and INT4 ties, the
fp8 scale's rounding (ties, subnormals, the zero clamp, saturation), zero blocks,
NaN/Inf, padding, smooth on the quantize path only, and refusals with reasons."""

from __future__ import annotations

import pytest
import torch

from quantcore.errors import TensorFormatError
from quantcore.formats.svdquant import SVDQuantAct, e2m1_values, pack_nibbles, unpack_nibbles
from quantcore.formats.svdquant.numerics import e2m1_codes
from quantcore.ops.act_quant_lora import act_quant_lora_reference

NVFP4, INT4 = SVDQuantAct(fp4=True), SVDQuantAct(fp4=False)
E4M3_ONE = 0x38  # 1.0 = exponent 7, mantissa 0
FP16_ONE = 0x3C00


def nvfp4_block(values: list[float], dtype: torch.dtype = torch.bfloat16) -> tuple[list[int], int]:
    """Codes and the scale byte of one 16-element block (row 0)."""
    assert len(values) == 16
    out = NVFP4.quantize(torch.tensor([values], dtype=dtype))
    codes = unpack_nibbles(out["qout"][0]).tolist()
    return codes, int(out["oscales"].view(torch.uint8)[0, 0])


def int4_block(values: list[float], dtype: torch.dtype = torch.bfloat16) -> tuple[list[int], int]:
    """Signed codes and the fp16 scale bits of one 64-element block."""
    assert len(values) == 64
    out = INT4.quantize(torch.tensor([values], dtype=dtype))
    codes = unpack_nibbles(out["qout"][0])
    signed = torch.where(codes >= 8, codes - 16, codes).tolist()
    return signed, int(out["oscales"].view(torch.int16)[0, 0])


# --- NVFP4 ---------------------------------------------------------------------------------


def test_e2m1_ties_go_to_the_even_code() -> None:
    # amax 6 → s = 1 exactly; every other entry is a midpoint between two E2M1 values
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    codes, scale = nvfp4_block([6.0, *ties, -6.0, *(-t for t in ties)])
    assert scale == E4M3_ONE
    #          6  .25 .75 1.25 1.75 2.5 3.5  5   (ties → 0, 1, 1, 2, 2, 4, 4)
    expected = [7, 0, 2, 2, 4, 4, 6, 6]
    assert codes == expected + [c | 8 for c in expected]
    assert e2m1_values(torch.tensor(codes[:8])).tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_e2m1_off_tie_values_go_to_the_nearest() -> None:
    vals = [6.0, 0.2, 0.3, 0.7, 0.8, 1.2, 1.3, 1.7, 1.8, 2.4, 2.6, 3.4, 3.6, 4.9, 5.1, 0.0]
    codes, _ = nvfp4_block(vals)
    assert codes == [7, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 0]


def test_negative_zero_and_small_negatives_keep_the_sign_bit() -> None:
    codes, _ = nvfp4_block([6.0, -0.0, -0.1, 0.1] + [0.0] * 12)
    assert codes[:4] == [7, 8, 8, 0]


@pytest.mark.parametrize(
    ("amax", "scale", "code_of_amax"),
    [
        (6.0 * 1.0625, E4M3_ONE, 7),  # s = 1.0625: tie between 1 and 1.125 → 1 (even); 6.375 saturates
        (6.0 * 1.1875, E4M3_ONE + 2, 7),  # s = 1.1875: tie between 1.125 and 1.25 → 1.25 (even)
        (6.0 * 2.0**-9, 0x01, 7),  # s = 2⁻⁹, the smallest subnormal, exactly
        (6.0 * 1.5 * 2.0**-9, 0x02, 6),  # s = 1.5·2⁻⁹: tie between 1 and 2 (·2⁻⁹) → 2; 4.5 → 4 (tie)
        (6.0 * 2.0**-10, 0x01, 5),  # s = 2⁻¹⁰ rounds to 0: clamped to 2⁻⁹; amax / 2⁻⁹ = 3
        (6.0 * 2.0**-12, 0x01, 2),  # a tiny block keeps codes: 0.75 → 1 (tie)
        (3000.0, 0x7E, 7),  # s = 500 > 448 saturates to 448; 6.7 saturates to 6
    ],
)
def test_fp8_scale_rounding(amax: float, scale: int, code_of_amax: int) -> None:
    codes, got = nvfp4_block([amax] + [0.0] * 15)
    assert got == scale
    assert codes[0] == code_of_amax


def test_elements_are_divided_by_the_stored_scale() -> None:
    # amax 6.375 → s8 = 1 (rounded down): 5.0 is a tie of 5/1 (→ 4), not of 5/1.0625
    codes, scale = nvfp4_block([6.375, 5.0, 2.5, 0.75] + [0.0] * 12)
    assert scale == E4M3_ONE and codes[:4] == [7, 6, 4, 2]


def test_all_zero_block_has_the_smallest_scale_and_zero_codes() -> None:
    codes, scale = nvfp4_block([0.0] * 16)
    assert scale == 0x01 and codes == [0] * 16
    deq = NVFP4.dequantize(NVFP4.quantize(torch.zeros(1, 16, dtype=torch.float16)))
    assert torch.isfinite(deq).all() and not deq.any()


def test_the_quantizer_runs_where_torch_has_no_where_for_8_bit_floats(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.6 (the oldest the package allows) has no ``torch.where`` for float8 on the
    CPU: the quantizer keeps its scales in float32 until they are stored, bit for bit."""
    want = NVFP4.quantize(torch.tensor([[0.0] * 16, [6.375, 5.0] + [1e-9] * 14], dtype=torch.bfloat16))
    real = torch.where

    def where(cond: torch.Tensor, a: object, b: object) -> torch.Tensor:
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn for t in (a, b)):
            raise RuntimeError('"where_cpu" not implemented for \'Float8_e4m3fn\'')
        return real(cond, a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "where", where)
    got = NVFP4.quantize(torch.tensor([[0.0] * 16, [6.375, 5.0] + [1e-9] * 14], dtype=torch.bfloat16))
    assert torch.equal(got["qout"], want["qout"])
    assert torch.equal(got["oscales"].view(torch.uint8), want["oscales"].view(torch.uint8))


def _torchao_block(values: list[float]) -> tuple[list[int], int]:
    out = NVFP4.quantize(torch.tensor([values], dtype=torch.float16), convention="torchao")
    return unpack_nibbles(out["qout"][0]).tolist(), int(out["oscales"].view(torch.uint8)[0, 0])


def test_torchao_convention_floors_every_scale_at_the_smallest_normal() -> None:
    # All zero: torchao stores 2⁻⁶ (0x08), this format 2⁻⁹ (0x01); codes 0 either way.
    assert _torchao_block([0.0] * 16) == ([0] * 16, 0x08)
    # amax 0.006: s = 0.001 is below 2⁻⁶. This format keeps the subnormal 2⁻⁹ (0.006 / 2⁻⁹
    # = 3.07 → code 5, value 3); torchao takes 2⁻⁶ (0.006 · 64 = 0.384 → code 1, value 0.5).
    tiny = [0.006] + [0.0] * 15
    assert nvfp4_block(tiny, torch.float16) == ([5] + [0] * 15, 0x01)
    assert _torchao_block(tiny) == ([1] + [0] * 15, 0x08)


def test_torchao_convention_multiplies_by_the_reciprocal() -> None:
    """A tie ``t · s8`` divided by s8 is the tie itself (→ even code); multiplied by the
    float32 reciprocal of s8 it can land off the tie. Some e4m3 mantissa must show it."""
    ties = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
    differ = 0
    for mantissa in range(8):
        s8 = 1 + mantissa / 8
        for t in ties:
            block = [6 * s8, t * s8] + [0.0] * 14  # amax = 6·s8: the scale is s8 exactly
            ours, scale = nvfp4_block(block, torch.float16)
            theirs, scale_t = _torchao_block(block)
            assert scale == scale_t
            y = torch.tensor(t * s8, dtype=torch.float32) * (1 / torch.tensor(s8, dtype=torch.float32))
            assert theirs[1] == int(e2m1_codes(y))
            differ += ours[1] != theirs[1]
    assert differ > 0
    with pytest.raises(TensorFormatError, match="convention"):
        INT4.quantize(torch.zeros(1, 64, dtype=torch.float16), convention="torchao")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nvfp4_non_finite_block_is_nan_with_zero_codes(bad: float) -> None:
    x = torch.full((1, 32), 1.5, dtype=torch.bfloat16)
    x[0, 3] = bad
    out = NVFP4.quantize(x)
    scales = out["oscales"].view(torch.uint8)[:, 0].tolist()
    codes = unpack_nibbles(out["qout"][0]).tolist()
    assert scales[0] == 0x7F and codes[:16] == [0] * 16
    assert scales[1] == 0x28 and codes[16:] == [7] * 16  # the other block: s = 0.25 (2⁻²), 1.5 / 0.25 = 6
    deq = NVFP4.dequantize(out)
    assert deq[0, :16].isnan().all() and torch.isfinite(deq[0, 16:]).all()


# --- INT4 ----------------------------------------------------------------------------------


def test_int4_half_ties_round_to_even() -> None:
    vals = [7.0, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, -0.5, -1.5, -2.5, -3.5, -4.5, -5.5, -6.5, -7.0]
    codes, scale = int4_block(vals * 4)
    assert scale == FP16_ONE
    assert codes[:16] == [7, 0, 2, 2, 4, 4, 6, 6, 0, -2, -2, -4, -4, -6, -6, -7]


def test_int4_nibbles_are_twos_complement_low_first() -> None:
    out = INT4.quantize(torch.tensor([[7.0, -7.0, -1.0, 3.0] * 16], dtype=torch.float16))
    # r = 1: codes 7, -7, -1, 3 → nibbles 7, 9, F, 3 → bytes 0x97, 0x3F
    assert out["qout"][0, :2].tolist() == [0x97, 0x3F]


def test_int4_codes_use_the_product_with_7_over_amax() -> None:
    # amax 3: 7/3 rounds up in float32, so 1.5 · fl(7/3) = 3.5000002 → 4 (by the scale
    # 3/7 it would be 3.4999998 → 3)
    codes, _ = int4_block([3.0, 1.5] + [0.0] * 62)
    assert codes[:2] == [7, 4]


def test_int4_zero_block_has_zero_scale_and_codes() -> None:
    codes, scale = int4_block([0.0] * 64)
    assert scale == 0 and codes == [0] * 64


def test_int4_block_too_small_for_7_over_amax() -> None:
    # amax 1e-39 (a float32 subnormal): 7 / amax overflows, so codes are 0; the stored
    # fp16 scale is 0 too, so the block dequantizes to 0 either way
    codes, scale = int4_block([1e-39, -5e-40] + [0.0] * 62)
    assert codes == [0] * 64 and scale == 0


def test_int4_scale_beyond_fp16_is_inf() -> None:
    _, scale = int4_block([1e6] + [0.0] * 63)
    assert scale == 0x7C00


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_int4_non_finite_block_is_nan_with_zero_codes(bad: float) -> None:
    x = torch.full((1, 128), 7.0, dtype=torch.float16)
    x[0, 70] = bad
    out = INT4.quantize(x)
    assert out["oscales"].view(torch.int16)[:, 0].tolist() == [FP16_ONE, 0x7E00]
    codes = unpack_nibbles(out["qout"][0]).tolist()
    assert codes[:64] == [7] * 64 and codes[64:] == [0] * 64


# --- shared --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [NVFP4, INT4], ids=["nvfp4", "int4"])
def test_padding_rows_are_zero_bytes(fmt: SVDQuantAct) -> None:
    x = torch.randn(3, 128).to(torch.bfloat16)
    lora = torch.randn(128, 8).to(torch.bfloat16)
    out = act_quant_lora_reference(fmt, x, lora)
    assert out.qout.shape == (256, 64) and out.oscales.shape == (128 // fmt.block, 256)
    assert out.lora_act_out.shape == (256, 8)
    assert not out.qout[3:].any()
    assert not out.oscales.float()[:, 3:].any()
    assert not out.lora_act_out[3:].any()
    assert out.qout[:3].any()


def test_m_pads_to_multiples_of_pad_size() -> None:
    for m, m_pad in [(1, 256), (255, 256), (256, 256), (257, 512), (4352, 4352)]:
        assert NVFP4.padded_rows(m) == m_pad
    assert SVDQuantAct(pad_size=128).quantize(torch.ones(130, 16, dtype=torch.float16))["qout"].shape == (256, 8)


def test_smooth_divides_the_quantize_path_only() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    lora = torch.randn(64, 16, generator=gen).to(torch.bfloat16)
    smooth = torch.full((64,), 2.0, dtype=torch.bfloat16)
    plain = act_quant_lora_reference(NVFP4, x, lora)
    smoothed = act_quant_lora_reference(NVFP4, x, lora, smooth)
    assert torch.equal(plain.lora_act_out, smoothed.lora_act_out)
    assert torch.equal(plain.lora_act_out[:4], x.double() @ lora.double())
    # dividing by 2 halves every scale (a power of two: codes unchanged)
    assert torch.equal(plain.qout, smoothed.qout)
    assert torch.equal(plain.oscales.float()[:, :4] / 2, smoothed.oscales.float()[:, :4])


@pytest.mark.parametrize("fmt", [NVFP4, INT4], ids=["nvfp4", "int4"])
def test_dequantize_is_within_half_a_step(fmt: SVDQuantAct) -> None:
    x = (torch.randn(8, 256, generator=torch.Generator().manual_seed(1)) * 3).to(torch.bfloat16)
    out = fmt.quantize(x)
    deq = fmt.dequantize(out)[:8]
    scales = out["oscales"].double().T[:8].repeat_interleave(fmt.block, dim=1)
    step = 2.0 if fmt.fp4 else 1.0  # the widest gap between codes, in units of the scale
    assert ((deq - x.double()).abs() <= step / 2 * scales * 1.07).all()  # fp8 scale rounding ≤ 1/16


def test_pack_unpack_round_trip() -> None:
    codes = torch.randint(0, 16, (5, 64))
    assert torch.equal(unpack_nibbles(pack_nibbles(codes)), codes)
    assert pack_nibbles(torch.tensor([[1, 2]])).tolist() == [[0x21]]


# --- refusals, with reasons ------------------------------------------------------------------


def test_n_not_a_multiple_of_the_block_is_refused() -> None:
    with pytest.raises(TensorFormatError, match=r"x: N=40 must be a positive multiple of the NVFP4 block size 16"):
        NVFP4.quantize(torch.zeros(2, 40, dtype=torch.float16))
    with pytest.raises(TensorFormatError, match=r"lora_down: N=96 must be a positive multiple of the INT4 block size 64"):
        INT4.validate({"lora_down": torch.zeros(96, 8, dtype=torch.float16)})


def test_validate_names_the_tensor_expected_and_got() -> None:
    ok = torch.zeros(64, 8, dtype=torch.bfloat16)
    assert NVFP4.validate({"lora_down": ok}) == {"N": 64, "R": 8}
    assert NVFP4.validate({"lora_down": torch.zeros(64, 0, dtype=torch.bfloat16)}) == {"N": 64, "R": 0}
    cases = [
        ({}, r"missing tensor\(s\) lora_down"),
        ({"lora_down": ok.float()}, r"lora_down: expected dtype float16 or bfloat16, got \(64, 8\) float32"),
        ({"lora_down": torch.zeros(64, dtype=torch.bfloat16)}, r"lora_down: expected 2-D \[N, R\], got \(64,\)"),
        ({"lora_down": ok, "smooth": torch.ones(32, dtype=torch.bfloat16)}, r"smooth: expected shape \(64,\), got \(32,\)"),
        ({"lora_down": ok, "bias": ok}, r"unexpected tensor\(s\) bias"),
    ]
    for tensors, match in cases:
        with pytest.raises(TensorFormatError, match=match):
            NVFP4.validate(tensors)


@pytest.mark.parametrize("bad", [0.0, float("nan"), float("inf")])
def test_smooth_with_zero_or_non_finite_entries_is_refused(bad: float) -> None:
    smooth = torch.ones(64, dtype=torch.float16)
    smooth[5] = bad
    with pytest.raises(TensorFormatError, match=r"smooth: expected finite non-zero entries, got 1 bad \(first at \[5\]"):
        NVFP4.validate({"lora_down": torch.zeros(64, 4, dtype=torch.float16), "smooth": smooth})
    with pytest.raises(TensorFormatError, match="smooth"):
        NVFP4.quantize(torch.zeros(1, 64, dtype=torch.float16), smooth=smooth)


def test_activation_dtype_and_rank_are_checked() -> None:
    with pytest.raises(TensorFormatError, match=r"x: expected dtype float16 or bfloat16, got \(2, 16\) float32"):
        NVFP4.quantize(torch.zeros(2, 16))


@pytest.mark.parametrize(
    ("x", "smooth", "message"),
    [  # what the fuzz found the golden quantizer crashing on or writing invalid outputs for
        (None, None, r"x: expected a torch.Tensor, got NoneType"),
        (torch.zeros(3, 0, dtype=torch.float16), None, r"x: N=0 must be a positive multiple of the NVFP4 block size 16"),
        (torch.zeros(3, 16, dtype=torch.float16, device="meta"), None, r"x: expected a 2-D \[M, N\] tensor with data"),
        (torch.zeros(16, dtype=torch.float16), None, r"x: expected a 2-D \[M, N\] tensor with data, got \(16,\)"),
        (torch.ones(2, 16, dtype=torch.float16), torch.ones(16, dtype=torch.float16, device="meta"),
         r"smooth on meta, x on cpu: expected one device"),
    ],
)
def test_golden_quantizer_refuses_what_it_cannot_quantize(x: object, smooth: object, message: str) -> None:
    with pytest.raises(TensorFormatError, match=message):
        NVFP4.quantize(x, smooth=smooth)  # type: ignore[arg-type]


def test_params_slug_and_from_params() -> None:
    assert (NVFP4.slug, INT4.slug, NVFP4.block, INT4.block) == ("svdquant-nvfp4", "svdquant-int4", 16, 64)
    assert SVDQuantAct.from_params(fp4="false") == INT4
    assert SVDQuantAct.from_params(fp4="1", pad_size="128") == SVDQuantAct(fp4=True, pad_size=128)
    assert NVFP4.params() == {"fp4": True, "pad_size": 256}
    with pytest.raises(TensorFormatError, match=r"fp4: expected a bool, got .maybe."):
        SVDQuantAct.from_params(fp4="maybe")
    with pytest.raises(TensorFormatError, match="pad_size: expected a positive int, got 0"):
        SVDQuantAct(pad_size=0)


def test_validate_output() -> None:
    out = NVFP4.quantize(torch.ones(3, 32, dtype=torch.float16))
    assert NVFP4.validate_output(out) == (256, 32)
    with pytest.raises(TensorFormatError, match=r"oscales: expected shape \(2, 256\)"):
        NVFP4.validate_output({"qout": out["qout"], "oscales": out["oscales"][:1]})
    with pytest.raises(TensorFormatError, match=r"oscales: expected dtype float16"):
        INT4.validate_output({"qout": torch.zeros(256, 32, dtype=torch.uint8), "oscales": torch.zeros(1, 256)})
