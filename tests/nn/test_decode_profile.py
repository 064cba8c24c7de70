"""How the per-part profile (``quantcore.benchmarks.decode_profile.attribute``) splits a
step's time, on events shaped as ``torch.profiler`` gives them (``prof.events()``):

- an op (``aten::mm``, ``quantcore::linear``, a ``record_function`` range) is a CPU event
  whose ``id`` is its correlation id; the ops around it are its ``cpu_parent`` chain;
- a launch (``cudaLaunchKernel``, activity ``cuda_runtime``) is a CPU event whose ``id``
  is the driver's correlation id — another numbering, so it may equal an op's — and whose
  ``linked_correlation_id`` is the op it was called in;
- a kernel is a CUDA event with its launch's ``id`` and its op's ``linked_correlation_id``
  (0 where no op was open: a compiled step's kernels, quantcore's eager calls);
- a ``record_function`` range also comes back as a CUDA event (``gpu_user_annotation``)
  spanning the kernels launched inside it: not work of its own.

The full profile of a tiny model on the CPU is tested with the suite
(``tests/nn/test_model_decode.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from torch.autograd import DeviceType

from quantcore.benchmarks.decode_profile import PARTS, attribute, table


class _Span:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end

    def elapsed_us(self) -> float:
        return self.end - self.start


class _Event:
    """The attributes of a ``torch.autograd.profiler_util.FunctionEvent`` that the
    attribution reads."""

    def __init__(self, name: str, device: DeviceType, kind: str, *, id: int = 0, link: int = 0,
                 span: tuple[float, float] = (0.0, 0.0), parent: Any = None, shapes: Any = None,
                 cpu_us: float = 0.0) -> None:
        self.name, self.device_type, self.activity_type = name, device, kind
        self.id, self.linked_correlation_id = id, link
        self.is_user_annotation = kind in ("user_annotation", "gpu_user_annotation")
        self.time_range, self.cpu_parent, self.input_shapes = _Span(*span), parent, shapes or []
        self.self_cpu_time_total = cpu_us


def _op(name: str, id: int, parent: Any = None, shapes: Any = None, cpu_us: float = 0.0) -> _Event:
    """An op, or a range inductor opens around a kernel's launch (named after the kernel)."""
    return _Event(name, DeviceType.CPU, "cpu_op", id=id, parent=parent, shapes=shapes, cpu_us=cpu_us)


def _range(name: str, id: int, parent: Any = None, cpu_us: float = 0.0) -> _Event:
    """A ``record_function`` range."""
    return _Event(name, DeviceType.CPU, "user_annotation", id=id, parent=parent, cpu_us=cpu_us)


def _launch(id: int, op: _Event | None, *, within: _Event | None = None, name: str = "cudaLaunchKernel") -> _Event:
    """A launch called in ``op`` (linked) or in a range ``within`` (not linked)."""
    return _Event(name, DeviceType.CPU, "cuda_runtime", id=id, link=op.id if op is not None else 0,
                  parent=op if op is not None else within)


def _kernel(name: str, span: tuple[float, float], *, id: int = 0, op: _Event | None = None) -> _Event:
    return _Event(name, DeviceType.CUDA, "kernel", id=id, link=op.id if op is not None else 0, span=span)


def _annotation(name: str, id: int, span: tuple[float, float]) -> _Event:
    return _Event(name, DeviceType.CUDA, "gpu_user_annotation", id=id, span=span)


def _compiled(id: int = 1) -> list[_Event]:
    """The ranges dynamo and inductor open around a compiled step."""
    region = _range("Torch-Compiled Region: 0/0", id)
    return [region, _range("## Call CompiledFxGraph fk3x2vzy7qu5n ##", id + 1, parent=region)]


def _filled(parts: dict[str, float | None]) -> float:
    return sum(v for v in parts.values() if v is not None)


def test_device_kernels_go_to_the_op_that_launched_them_and_idle_time_to_gaps() -> None:
    """A kernel's op is the one its ``linked_correlation_id`` names, not whatever event
    shares that number (the launches' ids collide with the ops' here); an LM head is a
    matmul over the vocabulary; a kernel no op names goes by its own name, reached through
    its launch; time two kernels share is split between them."""
    vocab = 1000
    qlinear = _op("quantcore::linear", 1)
    head = _op("aten::mm", 2, shapes=[[2, 64], [64, vocab]])
    attn = _op("aten::_scaled_dot_product_efficient_attention", 3)
    launches = [_launch(3, qlinear), _launch(1, head), _launch(2, attn), _launch(4, None), _launch(5, None)]
    kernels = [
        _kernel("int4_gemv", (0, 10), id=3, op=qlinear),
        _kernel("gemv2T_kernel", (12, 20), id=1, op=head),
        _kernel("fmha_cutlassF", (20, 26), id=2, op=attn),
        _kernel("triton_red_fused_add_mean_mul_pow_rsqrt_0", (30, 33), id=4),
        _kernel("triton_poi_fused_cat_mul_1", (31, 34), id=5),
    ]
    parts = attribute([qlinear, head, attn, *launches, *kernels], vocab, steps=2, wall_s=1.0)
    # idle: 10–12 and 26–30 of the 0–34 span; 31–33 is half the norm's, half the other's
    assert parts == {"linears": 0.005, "lm_head": 0.004, "attention": 0.003, "norms": 0.001, "other": 0.001,
                     "gaps": 0.003}


@pytest.mark.parametrize(("name", "part"), [
    ("nvjet_tst_128x64_64x8_1x1_v_bz_TNT", "linears"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", "linears"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(Params)",
     "linears"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, float, float, 128, 16, 4, 4, false, true>(...)", "linears"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(...)", "linears"),
    ("void tinygemm_m16n8k16_chunk_kernel<(KReductionType)0, 256, 8, 4, 32>(...)", "linears"),
    ("triton_tem_fused_mm_0", "linears"),
    ("wgmma_kernel", "linears"),
    ("gemv_kernel", "linears"),
    ("mma_kernel", "linears"),
    ("dequant_kernel", "linears"),
    ("moe_w8a16_kernel", "linears"),
    ("act_quant_lora_kernel", "linears"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norms"),
    ("triton_poi_fused_add_cat_index_copy_mul_neg_slice_1", "other"),
    ("void at::native::elementwise_kernel<128, 4, ...>(...)", "other"),
    ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>(...)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
    ("triton_poi_fused_embedding_0", "embedding"),
    ("triton_red_fused_argmax_2", "sampling"),
])
def test_a_compiled_steps_kernel_goes_by_its_name(name: str, part: str) -> None:
    """In a compiled step a kernel's launcher is inductor's generated code — a range
    named after the kernel, or nothing — so the kernel's name tells its part."""
    region, graph = _compiled()
    launcher = _op(name, 3, parent=graph) if name.startswith("triton_") else graph
    call = _launch(7, launcher, name="cuLaunchKernelEx")
    parts = attribute([region, graph, launcher, call, _kernel(name, (0, 5), id=7)], 1000, steps=1, wall_s=1.0)
    assert parts == {part: 0.005, "gaps": 0.0, **({"lm_head": None} if part == "linears" else {})}


def test_a_compiled_step_counts_each_kernel_once_within_the_wall_time() -> None:
    """The ranges around a compiled step come back as device events spanning its kernels,
    and every kernel is also folded into its op (``FunctionEvent.kernels``, not read):
    counted, they made a step's parts add up to more than its wall time. Each kernel
    counts once; the next kernel's prologue under programmatic dependent launch overlaps
    its predecessor, and their shared time is split."""
    vocab, steps = 1000, 2
    events: list[_Event] = []
    for step in range(steps):
        t = step * 50.0
        region, graph = _compiled(id=100 * step + 1)
        head = _op("aten::mm", 100 * step + 3, parent=graph, shapes=[[64, 64], [64, vocab]])
        fused = _op("triton_red_fused_add_mean_mul_pow_rsqrt_0", 100 * step + 4, parent=graph)
        events += [region, graph, head, fused]
        events += [_launch(100 * step + 50 + i, op) for i, op in enumerate([graph, graph, fused, head])]
        events += [
            _kernel("wgmma_kernel", (t + 0, t + 20), id=100 * step + 50),
            _kernel("wgmma_kernel", (t + 16, t + 30), id=100 * step + 51),  # launched early (PDL)
            _kernel("triton_red_fused_add_mean_mul_pow_rsqrt_0", (t + 32, t + 36), id=100 * step + 52, op=fused),
            _kernel("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", (t + 36, t + 46), id=100 * step + 53, op=head),
            _annotation(region.name, region.id, (t + 0, t + 46)),
            _annotation(graph.name, graph.id, (t + 0, t + 46)),
        ]
        events.append(_Event("Activity Buffer Request", DeviceType.CPU, "overhead", span=(t, t + 5)))
        events.append(_Event("cudaStreamSynchronize", DeviceType.CUDA, "cuda_sync", span=(t + 46, t + 50)))
    wall_s = 96e-6  # the first kernel's start to the last one's end
    parts = attribute(events, vocab, steps=steps, wall_s=wall_s)
    assert parts == {"linears": 0.03, "norms": 0.004, "lm_head": 0.01, "gaps": 0.004}
    assert _filled(parts) == pytest.approx(wall_s * 1e3 / steps)
    assert _filled(parts) <= wall_s * 1e3 / steps + 1e-4 * len(parts)  # rounding to 0.1 µs a part


def test_an_eager_runs_kernels_go_to_the_module_range_around_their_launch() -> None:
    """quantcore's eager calls skip the dispatcher: no op links their kernels, the
    ``part: …`` range around the module call is found through the launch."""
    linears = _range("part: linears", 1)
    norms = _range("part: norms", 2)
    rsqrt = _op("aten::rsqrt", 3, parent=norms)
    events = [linears, norms, rsqrt, _launch(10, None, within=linears), _launch(11, rsqrt)]
    events += [_kernel("gemv_kernel", (0, 8), id=10), _kernel("vectorized_elementwise_kernel", (9, 10), id=11, op=rsqrt),
               _annotation("part: linears", 1, (0, 8)), _annotation("part: norms", 2, (9, 10))]
    assert attribute(events, 1000, steps=1, wall_s=1.0) == {"linears": 0.008, "norms": 0.001, "gaps": 0.001}


def test_the_cpu_path_takes_each_ops_own_time_and_leaves_the_rest_to_the_host() -> None:
    """Without device events: each op's self time goes to its part (the innermost module
    range, else the op's name, an LM head by its shapes); ranges count only through their
    ops; the host gets what is left of the wall time."""
    vocab = 1000
    linears = _range("part: linears", 1, cpu_us=40.0)
    events = [
        linears,
        _op("aten::mm", 2, parent=linears, cpu_us=30.0),
        _op("aten::mm", 3, shapes=[[1, 64], [64, vocab]], cpu_us=20.0),
        _op("aten::_scaled_dot_product_flash_attention_for_cpu", 4, cpu_us=12.0),
        _op("aten::add", 5, cpu_us=6.0),
        _op("quantcore::linear", 6, cpu_us=8.0),
    ]
    parts = attribute(events, vocab, steps=2, wall_s=100e-6)
    assert parts == {"linears": 0.019, "lm_head": 0.01, "attention": 0.006, "other": 0.003, "host": 0.012}


def test_the_table_says_where_an_lm_head_it_could_not_tell_apart_went() -> None:
    result = {"case": "B64-T128-L32-H4096", "variants": {"bf16": {
        "wall_ms_per_step": 20.0, "kernels": "-",
        "parts_ms_per_step": {"linears": 14.0, "lm_head": None, "attention": 4.0, "gaps": 2.0}}}}
    _, names, _, row = table(result).splitlines()
    assert names.split()[:3 + len(PARTS)] == ["variant", "wall", "ms/step", *PARTS]
    assert row.split() == ["bf16", "20.000", "14.000", "4.000", "0.000", "in", "linears", "0.000", "0.000", "0.000",
                           "2.000", "-"]
