"""quantcore's modules as ordinary torch modules: buffers, state dicts, meta skeletons,
moves, memory, run-time fallback; and a model of them under torch.compile (one graph)
and torch.export (weights as buffers)."""

from __future__ import annotations

import gc
import io
import weakref
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import quantcore
from quantcore.custom_ops import flatten
from quantcore.custom_ops import spec as custom_op_spec
from quantcore.errors import KernelInputError, TensorFormatError
from quantcore.formats.gptq import GPTQ
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.formats.turboquant import TurboQuant
from quantcore.kernel import Requirements
from quantcore.nn.linear import QuantLinear
from quantcore.nn.moe import QuantExperts, QuantMoE
from quantcore.nn.svdquant import SVDQuantLinear
from quantcore.nn.turboquant import TurboQuantLinear
from quantcore.registry import hookimpl

FMT = GPTQ(bits=4, group_size=32, sym=False, desc_act=True)


def _tensors(k: int = 256, n: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return FMT.quantize(torch.randn(n, k, generator=gen) * 0.05, generator=gen)


def _unique_bytes(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def test_state_dict_round_trips_into_a_meta_skeleton() -> None:
    layer = QuantLinear(FMT, _tensors())
    x = torch.randn(3, 256).bfloat16()
    y = layer(x)
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert "_extra_state" in state and all(isinstance(v, torch.Tensor) for k, v in state.items() if k != "_extra_state")
    with torch.device("meta"):
        skeleton = QuantLinear(FMT, in_features=256, out_features=64)
    skeleton.load_state_dict(state, assign=True)
    assert skeleton.kernel is not None and skeleton.kernel.name == layer.kernel.name
    assert torch.equal(skeleton(x), y)
    # The same state into a module holding another kernel's layout: it takes the incoming one.
    other = QuantLinear(FMT, _tensors(seed=1), prefer="torch_fallback")
    assert other.kernel.name == "torch_fallback"
    other.load_state_dict(state)
    assert other.kernel.name == layer.kernel.name and torch.equal(other(x), y)
    wrong = QuantLinear(FMT, in_features=128, out_features=64)
    with pytest.raises(TensorFormatError, match=r"'K': 256.*module is gptq4-g32-asym-act of \{'K': 128"):
        wrong.load_state_dict(state)


def test_moves_never_cast_and_memory_is_the_prepared_state() -> None:
    tensors = _tensors()
    source_ref = weakref.ref(tensors["qweight"])
    layer = QuantLinear(FMT, tensors)
    prepared_bytes = _unique_bytes(flatten(layer.prepared).tensors)
    del tensors
    gc.collect()
    assert source_ref() is None  # the checkpoint's tensors are not kept
    held = _unique_bytes(b for _, b in layer.named_buffers())
    assert held <= 1.05 * prepared_bytes
    dtypes = {n: b.dtype for n, b in layer.named_buffers()}
    x = torch.randn(2, 256).bfloat16()
    y = layer(x)
    layer.to(torch.float16)
    layer.half().float()
    assert {n: b.dtype for n, b in layer.named_buffers()} == dtypes
    assert torch.equal(layer(x), y)
    kept = QuantLinear(FMT, _tensors(), keep_source=True)
    names = {n for n, _ in kept.named_buffers()}
    assert {"source_qweight", "source_scales"} <= names
    assert not any(k.startswith("source_") for k in kept.state_dict())


class _FailsInCall(quantcore.LinearKernel):
    """Prepares like the fallback, then fails when called: the vendor library that breaks
    at run time."""

    name: ClassVar[str] = "fails_in_call"
    format: ClassVar[str] = "gptq"
    priority: ClassVar[int] = 10_000
    requires: ClassVar[Requirements] = Requirements(device_types=frozenset({"cpu"}))

    def prepare(self, tensors: Any, *, dtype: torch.dtype | None = None) -> Any:
        return {"w": FMT.dequantize(tensors, dtype=torch.float32)}

    def __call__(self, x: torch.Tensor, prepared: Any) -> torch.Tensor:
        raise RuntimeError("device lost")


def test_keep_source_falls_back_at_run_time_and_takes_the_next_kernels_state() -> None:
    class Plugin:
        @hookimpl
        def quantcore_kernels(self) -> list[Any]:
            return [_FailsInCall]

    tensors = _tensors()
    x = torch.randn(2, 256).bfloat16()
    expected = QuantLinear(FMT, tensors)(x)
    name = quantcore.register(Plugin(), name="fails_in_call_plugin")
    try:
        plain = QuantLinear(FMT, tensors)
        assert plain.kernel.name == "fails_in_call"
        with pytest.raises(RuntimeError, match="device lost"):
            plain(x)  # without the source there is nothing to prepare again from
        kept = QuantLinear(FMT, tensors, keep_source=True)
        assert torch.equal(kept(x), expected)
        assert kept.kernel.name != "fails_in_call"
        assert ("fails_in_call", "call raised RuntimeError: device lost") in kept.passed_over
        assert kept.state_dict()["_extra_state"]["spec"] == kept._spec and "weight" in kept.state_dict()
    finally:
        quantcore.unregister(name)


class Block(nn.Module):
    """One of each module: GPTQ linear, TurboQuant linear, a MoE FFN, an SVDQuant linear."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.up = QuantLinear(FMT, _tensors(256, 128, seed=3))
        self.mix = TurboQuantLinear.from_linear(nn.Linear(128, 128), TurboQuant(group_size=64, residual=True),
                                                generator=gen, dtype=torch.bfloat16)
        moe = TRTLLMMoE(group_size=64, scale_dtype=torch.bfloat16)
        w1 = moe.quantize(torch.randn(4, 128, 128, generator=gen) * 0.05)
        w2 = moe.quantize(torch.randn(4, 64, 128, generator=gen) * 0.05)
        self.moe = QuantMoE(QuantExperts(moe, w1), QuantExperts(moe, w2))
        self.svd = SVDQuantLinear.from_linear(nn.Linear(128, 64), SVDQuantAct(fp4=False), rank=8)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        h = self.mix(torch.nn.functional.gelu(self.up(x)))
        return self.svd(self.moe(h, ids, weights))


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 256, generator=gen).bfloat16()
    ids = torch.randint(0, 4, (5, 2), generator=gen, dtype=torch.int32)
    return x, ids, torch.softmax(torch.randn(5, 2, generator=gen), dim=-1)


def test_a_model_of_every_module_compiles_to_one_graph() -> None:
    model = Block()
    args = _inputs()
    with torch.no_grad():
        eager = model(*args)
        explained = torch._dynamo.explain(model)(*args)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        ops = {str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"}
        assert {"quantcore.linear", "quantcore.moe", "quantcore.act_quant_lora"} <= ops
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)  # inductor, on the CPU
        assert torch.equal(compiled(*args), eager)


def test_export_lifts_every_weight_as_a_buffer_and_reloads_by_name(tmp_path: Path) -> None:
    model = Block()
    args = _inputs()
    with torch.no_grad():
        eager = model(*args)
    ep = torch.export.export(model, args)
    buffers = {s.target for s in ep.graph_signature.input_specs if s.kind == torch.export.graph_signature.InputKind.BUFFER}
    assert buffers == {n for n, _ in model.named_buffers()}
    assert not ep.graph_signature.parameters and not ep.constants
    calls = [n for n in ep.graph.nodes if n.op == "call_function" and str(n.target).startswith("quantcore.")]
    assert len(calls) == 5  # up, mix, moe w1 and w2, the SVDQuant pre-GEMM
    path = tmp_path / "block.pt2"
    torch.export.save(ep, path)
    # What a fresh process knows: nothing cached; the spec strings name everything.
    custom_op_spec._resolved.clear()
    loaded = torch.export.load(path)
    with torch.no_grad():
        assert torch.equal(loaded.module()(*args), eager)


def test_meta_inputs_give_shapes_without_running_a_kernel() -> None:
    layer = QuantLinear(FMT, _tensors())
    y = layer(torch.empty(7, 3, 256, dtype=torch.bfloat16, device="meta"))
    assert y.device.type == "meta" and y.shape == (7, 3, 64) and y.dtype == torch.bfloat16
    with pytest.raises(KernelInputError, match=r"no weight yet"):
        QuantLinear(FMT, in_features=256, out_features=64)(torch.randn(1, 256))


def test_a_move_the_kernel_cannot_follow_is_reported_at_the_next_call() -> None:
    """What ``.to("xpu")`` of a CPU-prepared layer leaves behind (the move itself needs the
    device; the CUDA test makes the real move): a call that names the kernel and the way out."""
    layer = QuantLinear(FMT, _tensors())
    x = torch.randn(2, 256).bfloat16()
    y = layer(x)
    layer._moved_to(torch.device("xpu"))
    with pytest.raises(KernelInputError, match=r"aten_cpu prepared this gptq4-g32-asym-act weight .* cannot run it on "
                                               r"xpu; build the module on xpu \(or with keep_source=True"):
        layer(x)
    layer._moved_to(torch.device("cpu"))
    assert torch.equal(layer(x), y)


@pytest.mark.parametrize("keep", [False, True])
def test_turboquant_holds_its_prepared_passes_and_rebuilds_the_format_from_them(keep: bool) -> None:
    fmt = TurboQuant(group_size=64, residual=True)
    gen = torch.Generator().manual_seed(8)
    layer = TurboQuantLinear.from_linear(nn.Linear(128, 64), fmt, generator=gen, keep_source=keep)
    prepared = _unique_bytes(flatten(layer.prepared).tensors)
    held = _unique_bytes(b for _, b in layer.named_buffers())
    assert (held <= 1.05 * prepared) is not keep
    tensors = layer.tensors()  # the inverse on the CPU's float32 passes, or the kept source
    again = TurboQuantLinear(128, 64, fmt)
    again.load_tensors(tensors)
    x = torch.randn(3, 128)
    assert torch.equal(again(x), layer(x))
