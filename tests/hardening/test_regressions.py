"""Each bug the fuzz suites found, pinned as a fixed example so CI keeps it fixed
whatever the generated cases happen to be (one test per fix, in the order found)."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from quantcore.backends.aten_cuda.transform import GPTQToTinygemm
from quantcore.backends.torch_fallback import fallback_for
from quantcore.backends.turboquant_torch import TurboQuantTorch
from quantcore.backends.turboquant_triton.fused import _to_output
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.errors import (
    InvalidArgumentError,
    KernelInputError,
    TensorFormatError,
    UnsupportedProblemError,
)
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.formats.turboquant import TurboQuant
from quantcore.problem import Problem
from quantcore.selection import get_kernel
from quantcore.transforms.awq_gptq import AWQToGPTQ
from quantcore.transforms.turboquant_passes import TurboQuantPassTransform

GEN = torch.Generator


GPTQ_FMT = GPTQ(group_size=32, sym=False)
TQ_FMT = TurboQuant(bits=2, residual=True)


def gptq_weights(fmt: GPTQ = GPTQ_FMT) -> dict[str, torch.Tensor]:
    gen = GEN().manual_seed(0)
    return fmt.quantize(torch.randn(64, 128, generator=gen), generator=gen)


def test_bool_parameters_refuse_strings() -> None:
    with pytest.raises(TensorFormatError, match="gptq sym: expected a bool, got 'false'"):
        GPTQ(sym="false")  # type: ignore[arg-type]
    with pytest.raises(TensorFormatError, match="awq layout"):
        AWQ(layout=-1)  # type: ignore[arg-type]
    assert GPTQ(bits=__import__("numpy").int64(4)).bits == 4 and type(GPTQ(bits=4).bits) is int


def test_from_params_refuses_unreadable_strings_and_unknown_names() -> None:
    with pytest.raises(TensorFormatError, match="gptq bits: expected a int, got 'x'"):
        GPTQ.from_params(bits="x")
    with pytest.raises(TensorFormatError, match="turboquant norm_dtype: expected a dtype"):
        TurboQuant.from_params(norm_dtype="nonsense")
    with pytest.raises(TensorFormatError, match="gptq sym: expected a bool, got 'maybe'"):
        GPTQ.from_params(sym="maybe")
    with pytest.raises(TensorFormatError, match="bogus: not a parameter of gptq"):
        GPTQ.from_params(bogus="1")
    assert TRTLLMMoE.from_params(scale_dtype="fp16", sym="no").sym is False


@pytest.mark.parametrize("bad", [None, "meta"])
def test_validate_names_none_and_meta_tensors(bad: str | None) -> None:
    fmt = GPTQ(group_size=32, sym=False)
    t = gptq_weights(fmt)
    t["g_idx"] = None if bad is None else t["g_idx"].to("meta")  # type: ignore[assignment]
    with pytest.raises(TensorFormatError, match=r"g_idx: (expected a torch.Tensor, got NoneType|a meta tensor holds no data)"):
        fmt.validate(t)


def test_quantizers_refuse_non_tensors_and_unrepresentable_ranges() -> None:
    with pytest.raises(TensorFormatError, match="weight: expected a 2-D float"):
        GPTQ().quantize(None)  # type: ignore[arg-type]
    huge = torch.full((64, 128), 3e38)
    huge[:, ::2] *= -1
    for fmt in (GPTQ(group_size=32), AWQ(group_size=32)):
        with pytest.raises(TensorFormatError, match="need scales beyond float16's range"):
            fmt.quantize(huge)
    with pytest.raises(TensorFormatError, match=r"need (scales|zeros) beyond float16's range"):
        TRTLLMMoE(sym=False).quantize(huge.unsqueeze(0))
    fp8 = torch.randn(64, 128, generator=GEN().manual_seed(1)).to(torch.float8_e4m3fn)
    GPTQ(group_size=32).validate(GPTQ(group_size=32).quantize(fp8))


def test_kernels_name_none_meta_and_scalar_inputs() -> None:
    fmt = GPTQ(group_size=32, sym=False)
    t = gptq_weights(fmt)
    kernel = fallback_for("gptq")(fmt, "cpu")
    with pytest.raises(TensorFormatError, match="qweight: a meta tensor holds no data"):
        kernel.prepare({**t, "qweight": t["qweight"].to("meta")})
    with pytest.raises(TensorFormatError, match=r"g_idx: expected a torch\.Tensor"):
        kernel.prepare({**t, "g_idx": None})  # type: ignore[dict-item]
    prepared = kernel.prepare(t)
    for x in (None, torch.tensor(1.0)):
        with pytest.raises(KernelInputError, match="x: expected"):
            kernel(x, prepared)  # type: ignore[arg-type]


def test_selection_arguments_are_quantcore_errors() -> None:
    p = Problem.linear(GPTQ(), M=1, K=128, N=64)
    with pytest.raises(InvalidArgumentError, match="format: gptq8"):
        get_kernel(GPTQ(bits=8), "cpu", problem=p)
    with pytest.raises(InvalidArgumentError, match="device: expected 'type' or 'type:index'"):
        get_kernel("gptq", "cuda:x")


def test_tinygemm_transform_refuses_cpu_tensors() -> None:
    with pytest.raises(UnsupportedProblemError, match="qweight: tinygemm's layout is made by a CUDA op"):
        GPTQToTinygemm(GPTQ(group_size=32, sym=False)).apply(gptq_weights())


def _turboquant(fmt: TurboQuant = TQ_FMT) -> dict[str, torch.Tensor]:
    return fmt.quantize(torch.randn(96, 256, generator=GEN().manual_seed(2)), generator=GEN().manual_seed(3))


def test_turboquant_dequantize_ignores_strides() -> None:
    fmt = TurboQuant(bits=2, residual=True)
    t = _turboquant(fmt)
    column_major = {**t, "residual_rotation": t["residual_rotation"].mT.contiguous().mT}
    assert torch.equal(fmt.dequantize(column_major), fmt.dequantize(t))


@pytest.mark.parametrize("broken", ["missing", "none", "flat rotation", "fp32 norms"])
def test_turboquant_pass_transform_validates(broken: str) -> None:
    fmt = TurboQuant(bits=2, residual=True)
    t = dict(_turboquant(fmt))
    if broken == "missing":
        del t["norms"]
    elif broken == "none":
        t["indices"] = None  # type: ignore[assignment]
    elif broken == "flat rotation":
        t["rotation"] = t["rotation"].reshape(-1)
    else:
        t["norms"] = t["norms"].float()
    with pytest.raises(TensorFormatError, match=r"(norms|indices|rotation)"):
        TurboQuantPassTransform(fmt, split_halves=False).apply(t)


def test_awq_to_gptq_refuses_unpackable_in_features() -> None:
    fmt = AWQ(group_size=-1)
    t = fmt.quantize(torch.randn(256, 128, generator=GEN().manual_seed(4)))
    short = {**t, "qweight": t["qweight"][:127]}
    with pytest.raises(UnsupportedProblemError, match="qweight: in_features = 127"):
        AWQToGPTQ(fmt).apply(short)


def test_torch_fallback_keeps_float32_and_refuses_wider_activations() -> None:
    fmt = GPTQ(bits=3, group_size=128, sym=False)
    t = gptq_weights(fmt)
    kernel = fallback_for("gptq")(fmt, "cpu")
    x = torch.randn(2, 128, generator=GEN().manual_seed(5))
    ref = x.double() @ fmt.dequantize(t).T
    y = kernel(x, kernel.prepare(t))
    assert (y.double() - ref).norm() / ref.norm() < 1e-5  # was 1e-4: weights rounded to fp16
    with pytest.raises(KernelInputError, match="needs more precision than the bf16 weight"):
        kernel(x.half(), kernel.prepare(t, dtype=torch.bfloat16))


def test_zero_folding_refuses_uneven_act_order_groups() -> None:
    from quantcore_example_plugin.kernel import ZeroFoldingGPTQ

    fmt = GPTQ(bits=3, group_size=32, sym=False, desc_act=True)
    t = gptq_weights(fmt)
    uneven = {**t, "g_idx": torch.zeros_like(t["g_idx"])}  # every input in group 0: valid
    fmt.validate(uneven)
    with pytest.raises(UnsupportedProblemError, match="g_idx: zero folding needs 4 groups of 32"):
        ZeroFoldingGPTQ(fmt, "cpu").prepare(uneven)


def test_turboquant_kernels_refuse_the_other_rotation_layout() -> None:
    # turboquant_cutile prepares the split-halves order; turboquant_triton reads index
    # words in the natural order, like turboquant_torch.
    from quantcore.backends.turboquant_cutile import TurboQuantCuTile

    fmt = TurboQuant(bits=2, residual=True)
    t = _turboquant(fmt)
    split = TurboQuantCuTile(fmt, "cpu").prepare(t)
    for other in (TurboQuantTorch, TurboQuantTriton):
        with pytest.raises(KernelInputError, match="prepared: its rotations are in the split_halves=True layout"):
            other(fmt, "cpu")(torch.randn(1, 256), split)
    natural = TurboQuantTriton(fmt, "cpu").prepare(t)
    with pytest.raises(KernelInputError, match="prepared: its rotations are in the split_halves=False layout"):
        TurboQuantCuTile(fmt, "cpu")(torch.randn(1, 256), natural)


def test_prepare_moves_stored_tensors_to_the_kernel_device() -> None:
    """aten_cpu/awq_cpu/aten_xpu/aten_cuda prepared tensors where they lay: CUDA tensors
    gave a CPU kernel CUDA metadata (a foreign error at call). Now every prepare moves
    them, and a device this build lacks is refused by name."""
    from quantcore.backends.aten_xpu.kernel import AtenXpuGPTQ

    with pytest.raises(UnsupportedProblemError, match="qweight: cannot be moved to xpu"):
        AtenXpuGPTQ(GPTQ_FMT, "xpu").prepare(gptq_weights())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_kernels_take_cuda_tensors() -> None:
    from quantcore.backends.aten_cpu.kernel import AtenCpuGPTQ

    t = gptq_weights()
    kernel = AtenCpuGPTQ(GPTQ_FMT, "cpu")
    x = torch.randn(2, 128, generator=GEN().manual_seed(6))
    y = kernel(x, kernel.prepare({k: v.cuda() for k, v in t.items()}))
    ref = x.double() @ GPTQ_FMT.dequantize(t).T
    assert (y.double() - ref).norm() / ref.norm() < 1e-5


def test_svdquant_prepare_refuses_meta_tensors_by_name() -> None:
    """svdquant prepare moved tensors with ``.to(device)``: a meta ``lora_down`` raised
    torch's NotImplementedError, which bind blamed on every svdquant kernel in turn."""
    from quantcore.backends.svdquant_torch.kernel import TorchActQuantLora
    from quantcore.formats.svdquant import SVDQuantAct

    meta = {"lora_down": torch.zeros(64, 8, dtype=torch.bfloat16, device="meta")}
    with pytest.raises(TensorFormatError, match="lora_down: a meta tensor holds no data"):
        TorchActQuantLora(SVDQuantAct(), "cpu").prepare(meta)


def test_svdquant_prepared_state_belongs_to_its_format() -> None:
    """An INT4 kernel took the state an NVFP4 kernel of the same class prepared and wrote
    INT4 codes for a layer its caller had prepared as NVFP4."""
    from quantcore.backends.svdquant_torch.kernel import TorchActQuantLora
    from quantcore.formats.svdquant import SVDQuantAct

    layer = {"lora_down": torch.randn(64, 8, generator=GEN().manual_seed(7)).to(torch.bfloat16)}
    nvfp4_state = TorchActQuantLora(SVDQuantAct(fp4=True), "cpu").prepare(layer)
    int4 = TorchActQuantLora(SVDQuantAct(fp4=False), "cpu")
    with pytest.raises(KernelInputError, match="prepared: made for svdquant-nvfp4, but this svdquant_torch writes svdquant-int4"):
        int4(torch.randn(2, 64, dtype=torch.bfloat16), nvfp4_state)


def test_bind_forwards_every_input_of_the_op() -> None:
    """``bind`` returned a callable of ``x`` alone: a bound MoE weight could not be given
    its routing (TypeError on ``topk_ids``)."""
    from quantcore.binding import bind
    from quantcore.ops.moe import moe_gemm_reference
    from quantcore.ops.moe.harness import GoldenExperts

    fmt = TRTLLMMoE(group_size=64)
    gen = GEN().manual_seed(8)
    stored = fmt.quantize(torch.randn(2, 128, 64, generator=gen), generator=gen)
    x = torch.randn(3, 128, generator=gen).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [1, 0], [1, 1]], dtype=torch.int32)
    weights = torch.full((3, 2), 0.5)
    y = bind(fmt, "cpu", stored, dtype=torch.bfloat16)(x, ids, topk_weights=weights)
    ref = moe_gemm_reference(x, ids, GoldenExperts(fmt, stored), weights)
    assert y.shape == ref.shape and (y.double() - ref).norm() / ref.norm() < 1e-2


def test_int4pack_kernels_take_an_empty_batch() -> None:
    """aten_cuda raised a foreign CUDA 'invalid argument' on x of shape (0, K): tinygemm's
    launch rejects a zero grid. No int4pack kernel launches on no rows now."""
    from quantcore.backends.aten_cpu.kernel import AtenCpuGPTQ

    device = "cuda" if torch.cuda.is_available() else "cpu"
    kernel = get_kernel(GPTQ(group_size=32, sym=False), device, problem=Problem.linear(
        GPTQ(group_size=32, sym=False), M=1, K=128, N=64, dtype=torch.bfloat16))
    if device == "cpu":
        assert isinstance(kernel, AtenCpuGPTQ)
    prepared = kernel.prepare({k: v.to(device) for k, v in gptq_weights().items()}, dtype=torch.bfloat16)
    y = kernel(torch.empty(0, 128, dtype=torch.bfloat16, device=device), prepared)
    assert y.shape == (0, 64) and y.dtype == torch.bfloat16


def test_svdquant_padding_rows_are_zero_with_a_negative_smooth(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton kernel quantized padding rows like real ones: 0 · a negative 1/smooth is
    -0, and NVFP4 codes carry the sign, so padding bytes came out 0x88 instead of 0."""
    from quantcore.backends.triton_nvfp4 import TritonNVFP4
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.ops.act_quant_lora import act_quant_lora_reference

    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fmt = SVDQuantAct(fp4=True)
    gen = GEN().manual_seed(9)
    layer = {"lora_down": torch.randn(64, 16, generator=gen).to(torch.bfloat16),
             "smooth": -torch.rand(64, generator=gen).add(0.5).to(torch.bfloat16)}
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    kernel = TritonNVFP4(fmt, device)
    qout, oscales, _ = kernel(x.to(device), kernel.prepare({k: v.to(device) for k, v in layer.items()}))
    want = act_quant_lora_reference(fmt, x, layer["lora_down"], layer["smooth"])
    assert torch.equal(qout.cpu(), want.qout)
    assert torch.equal(oscales.cpu().view(torch.uint8), want.oscales.view(torch.uint8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the interpreter uses fixed tiles)")
def test_turboquant_triton_autotuning_keys_the_group_size() -> None:
    """Found by the kernel fuzz on an H100: the autotuner cached its GEMM tile by (M, N,
    K) alone, so a group-32 layer after a group-64 one of the same shape reused a
    BLOCK_K of 32 bytes for 16-byte half groups, ran no step and returned zeros."""
    gen = GEN().manual_seed(10)
    x = torch.randn(2, 256, generator=gen).to(torch.bfloat16)
    for group_size in (64, 32):
        fmt = TurboQuant(bits=4, group_size=group_size)
        stored = fmt.quantize(torch.randn(96, 256, generator=gen), generator=gen)
        kernel = TurboQuantTriton(fmt, "cuda")
        y = kernel(x.cuda(), kernel.prepare({k: v.cuda() for k, v in stored.items()})).double().cpu()
        ref = x.double() @ fmt.dequantize(stored).T
        assert (y - ref).norm() / ref.norm() < 1e-2, f"group_size={group_size}"


@triton.jit
def _bf16_output(src, dst, n: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.arange(0, n)
    tl.store(dst + offs, _to_output(tl.load(src + offs), dst))


def test_turboquant_triton_bf16_rounding_keeps_nan() -> None:
    """Found by the kernel fuzz on an H100 (x at bf16's max, so every sum was NaN): the
    bf16 output rounding adds 0x7FFF to the float32 bits, and the GPU's NaN 0x7FFFFFFF
    carried into the sign bit, so NaN outputs were written as -0.0. Checked here through
    the interpreter on bit patterns the GPU makes."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs Triton's interpreter or a CUDA device")
    bits = torch.tensor([0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0x7F800000, 0xFF800000, 0x7F7FFFFF,
                         0x3F808000, 0x3F818000], dtype=torch.int64).to(torch.int32)
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    src = bits.view(torch.float32).to(device)
    out = torch.empty(8, dtype=torch.bfloat16, device=device)
    _bf16_output[(1,)](src, out, 8)
    want = bits.view(torch.float32).to(torch.bfloat16)  # torch rounds to nearest even; NaN stays NaN
    got = out.cpu()
    assert torch.equal(got.isnan(), want.isnan()), got
    assert torch.equal(got[~want.isnan()], want[~want.isnan()])


def test_svdquant_output_validator_refuses_meta_tensors() -> None:
    """Found by the nightly fuzz: ``validate_output`` took meta ``qout``/``oscales`` and
    ``dequantize`` then raised torch's device error."""
    from quantcore.formats.svdquant import SVDQuantAct

    fmt = SVDQuantAct()
    out = fmt.quantize(torch.randn(2, 32, generator=GEN().manual_seed(11)).to(torch.bfloat16))
    with pytest.raises(TensorFormatError, match="qout: a meta tensor holds no data"):
        fmt.dequantize({**out, "qout": out["qout"].to("meta")})


def test_svdquant_triton_row_tiles_divide_pad_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the nightly fuzz: with pad_size=16 the Triton kernel prepared, then
    refused every call of M > 16 (its row tile of 32+ rows did not divide pad_size)."""
    from quantcore.backends.triton_nvfp4 import TritonNVFP4
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.ops.act_quant_lora import act_quant_lora_reference

    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fmt = SVDQuantAct(fp4=True, pad_size=16)
    gen = GEN().manual_seed(12)
    layer = {"lora_down": torch.randn(64, 16, generator=gen).to(torch.bfloat16)}
    x = torch.randn(17, 64, generator=gen).to(torch.bfloat16)
    kernel = TritonNVFP4(fmt, device)
    qout, oscales, _ = kernel(x.to(device), kernel.prepare({k: v.to(device) for k, v in layer.items()}))
    want = act_quant_lora_reference(fmt, x, layer["lora_down"])
    assert qout.shape == (32, 32) and torch.equal(qout.cpu(), want.qout)
    assert torch.equal(oscales.cpu().view(torch.uint8), want.oscales.view(torch.uint8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compressed_tensors_writers_keep_one_device() -> None:
    """Found by the fuzz on a GPU: the compressed-tensors quantizer and the GPTQ →
    compressed-tensors inverse wrote ``weight_shape`` on the CPU beside CUDA codes, and
    the format's own validator refused the result (expected one device)."""
    from quantcore.formats.compressed_tensors import CompressedTensors
    from quantcore.transforms.compressed_gptq import CompressedToGPTQ

    fmt = CompressedTensors(bits=2, group_size=64, sym=False)
    weight = torch.randn(64, 128, generator=GEN().manual_seed(13)).to(torch.bfloat16).cuda()
    written = fmt.quantize(weight)
    assert {t.device.type for t in written.values()} == {"cuda"}
    fmt.validate(written)
    back = CompressedToGPTQ(fmt).invert(CompressedToGPTQ(fmt).apply(written))
    assert {t.device.type for t in back.values()} == {"cuda"}
    fmt.validate(back)


def test_int4pack_kernels_get_an_aligned_activation() -> None:
    """Found by the kernel fuzz on a GPU: an activation that is a view at an odd storage
    offset (contiguous, 6 bytes off) reached tinygemm's CUDA kernel as it was, whose
    16-byte loads faulted with a misaligned address. The shared int4pack call path now
    hands every op an aligned copy; the answer is the same."""
    from quantcore.backends.aten_cpu.kernel import AtenCpuGPTQ

    fmt = GPTQ(group_size=32, sym=False)
    t = gptq_weights(fmt)
    kernel = AtenCpuGPTQ(fmt, "cpu")
    prepared = kernel.prepare(t, dtype=torch.bfloat16)
    x = torch.randn(3, 128, generator=GEN().manual_seed(14)).to(torch.bfloat16)
    buf = torch.zeros(x.numel() + 3, dtype=x.dtype)
    shifted = buf[3:].view(x.shape)
    shifted.copy_(x)
    assert shifted.is_contiguous() and shifted.data_ptr() % 16
    seen: list[int] = []

    def op(x2: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:  # the kernel's own op, its pointer noted
        seen.append(x2.data_ptr())
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x2, prepared.weight, prepared.group_size, meta)

    y = prepared.run(shifted, op, (torch.bfloat16,))
    assert seen and seen[0] % 16 == 0
    assert torch.equal(y, kernel(x, prepared))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tinygemm_takes_an_activation_at_an_odd_offset() -> None:
    """The same activation at an odd storage offset on the GPU: aten_cuda answers as for
    the aligned one (it faulted with a misaligned address before)."""
    from quantcore.backends.aten_cuda.kernel import AtenCudaGPTQ

    fmt = GPTQ(group_size=128, sym=False)
    gen = GEN().manual_seed(15)
    t = fmt.quantize(torch.randn(256, 128, generator=gen), generator=gen)
    kernel = AtenCudaGPTQ(fmt, "cuda")
    prepared = kernel.prepare({k: v.cuda() for k, v in t.items()})
    x = torch.randn(1, 128, generator=gen).to(torch.bfloat16).cuda()
    shifted = torch.zeros(x.numel() + 3, dtype=x.dtype, device="cuda")[3:].view(x.shape)
    shifted.copy_(x)
    assert torch.equal(kernel(shifted, prepared), kernel(x, prepared))
    torch.cuda.synchronize()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device beside the CPU")
def test_bind_takes_stored_tensors_on_two_devices() -> None:
    """A weight whose stored tensors lay on the CPU and the GPU bound (each kernel's
    prepare moves them), then refused every call: the first call's output check read the
    caller's tensors with the format's one-device rule."""
    from quantcore.binding import bind

    fmt = AWQ(group_size=128)
    gen = GEN().manual_seed(11)
    stored = fmt.quantize(torch.randn(256, 128, generator=gen), generator=gen)
    mixed = dict(stored, qweight=stored["qweight"].cuda())
    x = torch.randn(3, 128, generator=gen).to(torch.bfloat16)
    y = bind(fmt, "cuda", mixed, dtype=torch.bfloat16)(x.cuda())
    ref = x.double() @ fmt.dequantize(stored).T.double()
    assert y.shape == ref.shape and (y.double().cpu() - ref).norm() / ref.norm() < 1e-2


@triton.jit
def _bf16_to_float32(src, dst, n: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.arange(0, n)
    tl.store(dst + offs, tl.load(src + offs).to(tl.float32))


def test_a_subnormal_bf16_reads_as_zero_only_under_the_interpreter() -> None:
    """Found by the nightly kernel fuzz: trtllm_moe_triton answered zero for subnormal
    bf16 activations under the interpreter (relative error 1 against the golden), because
    the interpreter's software bf16 → float32 conversion gives zero there; a compiled
    kernel converts exactly. The fuzz computes an interpreted call's golden output on what
    the interpreter reads (``interpreters_view``). When a Triton release converts them
    exactly, this fails and that view can go."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs Triton's interpreter or a CUDA device")
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interpreted else "cuda"
    tiny = torch.finfo(torch.bfloat16).smallest_normal
    src = torch.tensor([tiny / 4, -tiny / 2, tiny, 1.5], dtype=torch.bfloat16, device=device)
    out = torch.empty(4, device=device)
    _bf16_to_float32[(1,)](src, out, 4)
    want = src.float().cpu()
    if interpreted:
        want[:2] = 0.0
    assert torch.equal(out.cpu(), want), out
