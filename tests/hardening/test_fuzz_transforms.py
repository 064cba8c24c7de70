"""Fuzzed bad inputs for every transform: each is built for a format the registry holds
and applied to that format's mutated stored tensors (or, for the TensorRT-LLM
preprocessor, to a mutated int8 weight), and what it returns is judged by what it
declares (``fuzz/transforms.py``): its target format, its inverse, or the kernel that
runs its layout."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore.backends.trtllm_moe.preprocess import CutlassMixedGemmLayout, QuantType
from quantcore.errors import QuantCoreError
from quantcore.formats.base import Format
from quantcore.transform import Transform

from ..trtllm_moe.cpp_oracle import preprocess as cpp_preprocess
from .fuzz.mutations import FLOAT_DTYPES, LAYOUTS, mutate_tensors
from .fuzz.op_oracles import oracle_for
from .fuzz.profiles import examples
from .fuzz.seeds import DEVICE, seed_cases, seed_tensors, seeds_for
from .fuzz.tally import attempt
from .fuzz.transforms import FormatTransform, all_transforms, format_transforms, kernel_for_layout
from .test_fuzz_kernels import meaning, names_for

FORMAT_TRANSFORMS = format_transforms()
#: Transforms with an adapter of their own below.
EXPLICIT: dict[type, str] = {CutlassMixedGemmLayout: "int8 weight"}


def test_every_transform_is_fuzzed() -> None:
    """A new transform must be reachable: built from a format (``__init__(self, fmt)``)
    and judged by a target, an inverse or a kernel, or given an adapter here."""
    generic = {ft.cls for ft in FORMAT_TRANSFORMS}
    missing = [t.__qualname__ for t in all_transforms() if t not in generic and t not in EXPLICIT]
    assert not missing, f"transforms the fuzz suite cannot build: {missing}"
    unjudged = [ft.name for ft in FORMAT_TRANSFORMS if _judge_kind(ft) is None]
    assert not unjudged, f"transforms whose output nothing judges: {unjudged}"
    unseeded = [ft.name for ft in FORMAT_TRANSFORMS if not seeds_for(ft.format_cls.name)]
    assert not unseeded, f"transforms whose format has no seed cases: {unseeded}"


def _judge_kind(ft: FormatTransform) -> str | None:
    if "target" in ft.cls.__init__.__code__.co_names or hasattr(ft.cls, "target"):
        return "target"
    if ft.cls.invert is not Transform.invert:
        return "inverse"
    if kernel_for_layout(ft.output_type, ft.format_cls.name) is not None:
        return "kernel"
    return None


@contextlib.contextmanager
def runnable_here(kernel_cls: type) -> Iterator[None]:
    """Kernels whose op does not exist on this machine run their contract's emulation
    (aten_xpu's op, here, as tests/xpu does)."""
    from quantcore.backends.aten_xpu import kernel as xpu_kernel
    from quantcore.backends.aten_xpu.contract import weight_int4pack_mm_with_scales_and_zeros

    with pytest.MonkeyPatch.context() as mp:
        if kernel_cls is xpu_kernel.AtenXpuGPTQ:
            mp.setattr(xpu_kernel, "fused_mm", weight_int4pack_mm_with_scales_and_zeros)
        yield


def _equal(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return False
    if a.dtype != b.dtype and (a.is_floating_point() or b.is_floating_point()):
        return False
    a, b = a.detach().cpu(), b.detach().cpu().to(a.dtype)
    if a.is_floating_point():
        same = (a == b) | (a.isnan() & b.isnan())
        if a.dtype in (torch.float32, torch.float64):
            # A float32 value rebuilt by an inverse (x / c · c) may differ by one rounding.
            same |= (a - b).abs() <= a.abs() * torch.finfo(torch.float32).eps
        return bool(same.all())
    return torch.equal(a, b)


def _device_of(tensors: Any) -> torch.device | None:
    """Where a transform's result lies: its first tensor's device (None if it holds none)."""
    values = tensors.values() if isinstance(tensors, Mapping) else ()
    return next((t.device for t in values if isinstance(t, torch.Tensor)), None)


class Judge:
    def __init__(self, ft: FormatTransform, t: Transform[Any, Any], fmt: Format, src: Mapping[str, Any],
                 data: st.DataObject, act_dtype: torch.dtype) -> None:
        self.ft, self.t, self.fmt, self.src, self.data, self.act_dtype = ft, t, fmt, src, data, act_dtype

    def __call__(self, out: Any) -> str | None:
        kind = _judge_kind(self.ft)
        try:
            if kind == "target":
                return self.by_target(out)
            if kind == "inverse":
                return self.by_inverse(out)
            return self.by_kernel(out)
        except QuantCoreError as exc:
            return f"its output is refused downstream: {type(exc).__name__}: {exc}"

    def read(self, device: torch.device | None = None) -> dict[str, torch.Tensor] | str:
        """The source as its format reads it, on ``device`` (the fuzz device unless given:
        a transform's result is compared where it lies, which need not be the fuzz device)."""
        read, why = meaning(self.fmt, self.src, device or torch.device(DEVICE))
        return read if read is not None else f"accepted tensors the format refuses ({why})"

    def by_target(self, out: Any) -> str | None:
        read = self.read(_device_of(out))
        if isinstance(read, str):
            return read
        target: Format = self.t.target  # type: ignore[attr-defined]
        if not torch.equal(target.dequantize(out), self.fmt.dequantize(read)):
            return f"the {target.slug} result dequantizes differently from the {self.fmt.slug} source"
        return None

    def by_inverse(self, out: Any) -> str | None:
        back = self.t.invert(out)
        for name, value in back.items():
            if name in self.src and not _equal(value, self.src[name]):
                return f"the inverse gives a different {name} back"
        read = self.read(_device_of(back))
        if isinstance(back, Mapping) and set(back) >= {n for n in self.src if n not in back} and not isinstance(read, str):
            try:
                rebuilt = self.fmt.dequantize(back)
            except QuantCoreError:
                return None  # the inverse of a partial transform (one pass): compared above
            if not torch.equal(rebuilt, self.fmt.dequantize(read)):
                return "the inverse dequantizes differently from the source"
        return None

    def by_kernel(self, out: Any) -> str | None:
        read = self.read()
        if isinstance(read, str):
            return read
        kernel_cls = kernel_for_layout(self.ft.output_type, self.fmt.name)
        oracle = oracle_for(kernel_cls.op)  # type: ignore[union-attr]
        assert kernel_cls is not None and oracle is not None
        kernel = kernel_cls(self.fmt, torch.device(DEVICE))
        dims = self.fmt.validate(read)
        with runnable_here(kernel_cls):
            for act in dict.fromkeys([self.act_dtype, *FLOAT_DTYPES]):
                inputs = oracle.nominal(self.data, dims, act)
                try:
                    y = oracle.call(kernel, out, inputs)
                except QuantCoreError:
                    continue
                return oracle.judge(y, self.fmt, read, inputs)
        return f"{kernel_cls.name} takes no activation with this layout"


@pytest.mark.parametrize("ft", FORMAT_TRANSFORMS, ids=lambda ft: ft.name)
@settings(max_examples=examples("kernel"))
@given(data=st.data())
def test_format_transform(ft: FormatTransform, data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(seeds_for(ft.format_cls.name)), label="seed")
    fmt, tensors = case.format, seed_tensors(case)
    flags = {f: data.draw(st.booleans(), label=f) for f in ft.flags}
    target = f"transform:{ft.name}"
    oracle = oracle_for(case.op)
    assert oracle is not None
    names = names_for(fmt, oracle, tensors)
    outcome, t = attempt(target, lambda: ft.build(fmt, **flags), names=names, context=case.id)
    if outcome == "refused":
        return
    foreign = [seed_tensors(c) for c in data.draw(st.lists(st.sampled_from(seed_cases()), min_size=1, max_size=2), label="foreign")]
    mutate = data.draw(st.booleans(), label="mutate")
    done, src = mutate_tensors(data, tensors, foreign) if mutate else ([], dict(tensors))

    def context() -> str:
        return f"{case.id} {flags}: {'; '.join(done) or 'unmutated'}"

    outcome, _ = attempt(target, lambda: t.apply(src), names=names_for(fmt, oracle, tensors, src),
                         judge=Judge(ft, t, fmt, src, data, case.act_dtype), context=context)
    if outcome == "refused" and all(d.endswith(tuple(LAYOUTS)) for d in done):
        original, _ = attempt(target, lambda: t.apply(tensors), names=names, context=context)
        assert original == "refused", f"{target} refused a layout-only change of an input it takes\n{context()}"


# --- TensorRT-LLM's mixed-GEMM preprocessor: one int8 weight ---------------------------------

SHAPES = {QuantType.W8_A16: [(1, 64, 32), (2, 128, 96)],
          QuantType.W4_A16: [(1, 64, 64), (2, 128, 128)],
          QuantType.W4_AFP8: [(1, 128, 64)]}
ARCHS = (70, 72, 75, 80, 86, 89, 90, 60, 100, 0, -1)


@settings(max_examples=examples("kernel"))
@given(data=st.data())
def test_cutlass_preprocessor(data: st.DataObject) -> None:
    """The preprocessor on mutated weights and every (weight type, arch, force_interleave):
    refused by name, or bit-exact against the loop-by-loop C++ rendering and inverted."""
    qt = data.draw(st.sampled_from(list(QuantType)), label="quant_type")
    arch = data.draw(st.sampled_from(ARCHS), label="arch")
    force = data.draw(st.booleans(), label="force_interleave")
    e, k, n = data.draw(st.sampled_from(SHAPES[qt]), label="shape")
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    w = torch.randint(-128, 128, (e, k, n * qt.bits // 8), dtype=torch.int8, generator=gen)
    if data.draw(st.booleans(), label="2-D"):
        w = w[0]
    done, mutated = mutate_tensors(data, {"weight": w}, [], max_mutations=2) if data.draw(st.booleans(), label="mutate") else ([], {"weight": w})
    weight = mutated.get("weight")
    layout = CutlassMixedGemmLayout(qt, arch, force)

    def judge(out: Any) -> str | None:
        if not isinstance(weight, torch.Tensor) or not isinstance(out, torch.Tensor):
            return f"accepted {type(weight).__name__}"
        if out.dtype != torch.int8 or out.shape != weight.shape or out.device != weight.device:
            return f"output {tuple(out.shape)} {out.dtype} on {out.device} for a weight of {tuple(weight.shape)} on {weight.device}"
        if weight.device.type == "meta":
            return None  # shapes only (what fake-tensor tracing does): nothing else to compare
        w3 = weight.detach().cpu().contiguous()
        w3 = w3.unsqueeze(0) if w3.dim() == 2 else w3
        try:
            expected = cpp_preprocess(w3.numpy(), qt.bits, arch, force, fp8_act=qt is QuantType.W4_AFP8)
        except Exception as exc:
            return f"accepted a weight the C++ preprocessor cannot take ({type(exc).__name__}: {exc})"
        if not np.array_equal(out.detach().cpu().reshape(w3.shape).numpy(), expected):
            return "differs from the C++ preprocessor"
        if not _equal(layout.invert(out), weight):
            return "the inverse does not give the weight back"
        return None

    attempt("transform:cutlass_mixed_gemm_preprocess", lambda: layout.apply(weight),  # type: ignore[arg-type]
            names=("weight", "arch", "quant_type", "K", "N"), judge=judge,
            context=lambda: f"{qt.value} sm{arch} force={force} {(e, k, n)}: {'; '.join(done) or 'unmutated'}")
