"""Fused projections in a model: a tiny Llama (transformers, from a config, on the CPU)
whose q/k/v and gate/up become one quantized linear each. The model's own code runs
unchanged — eagerly, under ``torch.compile(fullgraph=True)`` and ``torch.export`` — and
gives what the unfused model gives (the same kernels on the concatenated weight: bit for
bit here, where each kernel computes every output column on its own); state dicts load
the fused layer's names and the checkpoint's original ones; and every group that cannot
be fused is refused with the layers named."""

from __future__ import annotations

import copy
import sys
import warnings

import pytest
import torch
from torch import nn

import quantcore
from quantcore.errors import FusionError, QuantCoreWarning, TensorFormatError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.formats.turboquant import TurboQuant
from quantcore.nn.fuse import FusedSlice, FusionGroup, fused_module
from quantcore.nn.linear import QuantLinear
from quantcore.nn.turboquant import TurboQuantLinear

transformers = pytest.importorskip("transformers")

LAYERS = 2
PARTS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def _dense(seed: int = 0) -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(seed))


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _not_head(m: nn.Module, name: str) -> bool:
    return name != "lm_head"


def _quantized(dense: nn.Module, fmt, *, fuse: bool, **kwargs) -> nn.Module:
    return quantcore.quantize_(copy.deepcopy(dense), fmt, filter_fn=_not_head, dtype=torch.float32, fuse=fuse,
                               **kwargs)


def _with_shared_draws(dense: nn.Module, fmt) -> nn.Module:
    """The model's projections quantized one by one, each group's parts from one random
    draw (act-order's column order, TurboQuant's rotation) and keeping their source, as
    a checkpoint quantized for fusion holds them."""
    model = copy.deepcopy(dense)
    for i, layer in enumerate(model.model.layers):
        for block, leaves in ((layer.self_attn, PARTS[:3]), (layer.mlp, PARTS[3:])):
            for leaf in leaves:
                linear = getattr(block, leaf)
                tensors = dict(fmt.quantize(linear.weight.detach().float(), generator=torch.Generator().manual_seed(i)))
                setattr(block, leaf, fused_module(fmt, tensors, device="cpu", dtype=torch.float32, keep_source=True))
    return model


def _calls(model: nn.Module) -> int:
    return sum(isinstance(m, (QuantLinear, TurboQuantLinear)) for m in model.modules())


# --- the same outputs -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [GPTQ(bits=4, group_size=32), GPTQ(bits=8, group_size=64, sym=False), AWQ(group_size=32)],
                         ids=lambda f: f.slug)
def test_quantize_fuse_gives_the_unfused_models_logits_bit_for_bit(fmt) -> None:
    dense, ids = _dense(), _ids()
    unfused, fused = _quantized(dense, fmt, fuse=False), _quantized(dense, fmt, fuse=True)
    assert _calls(unfused) == 7 * LAYERS and _calls(fused) == 4 * LAYERS
    for layer in fused.model.layers:
        assert isinstance(layer.self_attn.qkv_proj, QuantLinear) and layer.self_attn.qkv_proj.out_features == 256
        assert isinstance(layer.mlp.gate_up_proj, QuantLinear) and layer.mlp.gate_up_proj.out_features == 512
        assert [layer.self_attn.q_proj.out_features, layer.self_attn.k_proj.out_features] == [128, 64]
        assert all(isinstance(getattr(layer.self_attn, p), FusedSlice) for p in PARTS[:3])
    kernels = {m.kernel.name for m in fused.modules() if isinstance(m, QuantLinear)}
    assert kernels == {m.kernel.name for m in unfused.modules() if isinstance(m, QuantLinear)}
    assert torch.equal(_logits(fused, ids), _logits(unfused, ids))


@pytest.mark.parametrize("fmt", [GPTQ(bits=4, group_size=32, sym=False, desc_act=True),
                                 TurboQuant(bits=4, group_size=64),
                                 TurboQuant(bits=4, group_size=64, residual=True)], ids=lambda f: f.slug)
def test_fuse_projections_of_layers_from_one_draw_gives_their_logits(fmt) -> None:
    dense, ids = _dense(), _ids()
    unfused, fused = _with_shared_draws(dense, fmt), _with_shared_draws(dense, fmt)
    names = quantcore.fuse_projections(fused)
    assert names == [f"model.layers.{i}.{block}" for i in range(LAYERS)
                     for block in ("mlp.gate_up_proj", "self_attn.qkv_proj")]
    assert _calls(unfused) == 5 * LAYERS and _calls(fused) == 2 * LAYERS
    assert torch.equal(_logits(fused, ids), _logits(unfused, ids))
    # quantize_(fuse=True) draws once per group as well: its parts agree, so it fuses every group.
    assert _calls(_quantized(dense, fmt, fuse=True)) == 4 * LAYERS


@pytest.mark.parametrize(("fmt", "bound"), [(GPTQ(bits=4, group_size=32, sym=False), 0.2),
                                             (GPTQ(bits=4, group_size=32, sym=False, desc_act=True), 0.2),
                                             (GPTQ(bits=8, group_size=64), 0.015), (AWQ(group_size=32), 0.2),
                                             (TurboQuant(bits=4, group_size=64), 0.22),
                                             (TurboQuant(bits=4, group_size=64, residual=True), 0.025)],
                         ids=lambda v: v.slug if hasattr(v, "slug") else "")
def test_the_fused_quantized_model_stays_near_the_dense_one(fmt, bound: float) -> None:
    """Quality beside speed: the fused model's logits against the dense model's (random
    transformers init, so the numbers are the quantizer's on Gaussian weights; measured
    here: 4-bit 0.15–0.17, 8-bit 0.0095, TurboQuant 4-bit with residual 0.015)."""
    dense, ids = _dense(), _ids()
    ref, got = _logits(dense, ids), _logits(_quantized(dense, fmt, fuse=True), ids)
    err = ((got - ref).norm() / ref.norm()).item()
    assert 0 < err < bound, (fmt.slug, err)


def test_one_fused_call_serves_every_part_and_a_new_input_runs_again() -> None:
    model = _quantized(_dense(), GPTQ(bits=4, group_size=32), fuse=True)
    attn = model.model.layers[0].self_attn
    calls = []
    attn.qkv_proj.register_forward_hook(lambda *args: calls.append(1))
    x = torch.randn(3, 128)
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    assert len(calls) == 1 and q.shape == (3, 128) and k.shape == v.shape == (3, 64)
    whole = attn.qkv_proj(x)
    assert torch.equal(torch.cat([q, k, v], -1), whole) and q.data_ptr() != k.data_ptr()
    calls.clear()
    # Another input, or the same tensor changed in place in between: the fused layer runs again.
    assert torch.equal(attn.q_proj(x), q)
    y = torch.randn(3, 128)
    assert torch.equal(attn.k_proj(y), attn.qkv_proj(y)[:, 128:192])
    x.mul_(2)
    assert torch.equal(attn.v_proj(x), attn.qkv_proj(x)[:, 192:])
    assert len(calls) == 5  # q(x), k(y) and its check, v(2x) and its check
    with torch.inference_mode():  # inference tensors have no version counter
        z = torch.randn(3, 128)
        assert torch.equal(torch.cat([attn.q_proj(z), attn.k_proj(z), attn.v_proj(z)], -1), attn.qkv_proj(z))


def test_the_parts_of_one_fused_call_add_one_split_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """Host cost: what the parts ask of torch beyond the fused layer's own call is one
    split_with_sizes per fused call (each aten op costs the host microseconds on a GPU),
    not through Tensor.split's Python wrapper."""
    from tests.aten_ops import AtenOps

    model = _quantized(_dense(), GPTQ(bits=4, group_size=32), fuse=True)
    attn = model.model.layers[0].self_attn
    x = torch.randn(1, 1, 128)
    whole = attn.qkv_proj(x)
    attn.qkv_proj.forward = lambda _: whole  # the fused layer's own ops left out of the count
    wrapped: list[object] = []
    split = torch.Tensor.split
    monkeypatch.setattr(torch.Tensor, "split", lambda *a, **kw: wrapped.append(a) or split(*a, **kw))
    counted = AtenOps()
    with torch.no_grad(), counted:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    assert counted.ops == ["split_with_sizes"] and not wrapped
    assert torch.equal(torch.cat([q, k, v], -1), whole)


def test_threads_sharing_a_fused_model_each_get_their_own_inputs_outputs() -> None:
    from concurrent.futures import ThreadPoolExecutor

    attn = _quantized(_dense(), GPTQ(bits=4, group_size=32), fuse=True).model.layers[0].self_attn
    inputs = [torch.randn(2, 128, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    want = [attn.qkv_proj(x) for x in inputs]

    def work(i: int) -> bool:
        x = inputs[i]
        return all(torch.equal(torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], -1), want[i])
                   for _ in range(100))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns between any two bytecodes
    try:
        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(work, range(4)))
    finally:
        sys.setswitchinterval(interval)


# --- compile and export ---------------------------------------------------------------------------


def test_the_models_code_compiles_to_one_graph_with_one_op_per_fused_layer() -> None:
    model, ids = _quantized(_dense(), GPTQ(bits=4, group_size=32), fuse=True), _ids()
    eager = _logits(model, ids)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(ids)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    ops = [n for g in explained.graphs for n in g.graph.nodes if str(n.target) == "quantcore.linear"]
    assert len(ops) == 4 * LAYERS
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    assert torch.equal(_logits(compiled, ids), eager)
    assert torch.equal(_logits(compiled, _ids(2)), _logits(model, _ids(2)))


def test_export_holds_the_fused_buffers_and_gives_the_eager_logits() -> None:
    model, ids = _quantized(_dense(), TurboQuant(bits=4, group_size=64), fuse=True), _ids()
    eager = _logits(model, ids)
    with torch.no_grad():
        ep = torch.export.export(model, (ids,), {"use_cache": False})
    buffers = {s.target for s in ep.graph_signature.input_specs
               if s.kind == torch.export.graph_signature.InputKind.BUFFER}
    assert any(".self_attn.qkv_proj." in b for b in buffers) and not any(".q_proj." in b for b in buffers)
    calls = [n for n in ep.graph.nodes if n.op == "call_function" and str(n.target).startswith("quantcore.")]
    assert len(calls) == 4 * LAYERS
    with torch.no_grad():
        assert torch.equal(ep.module()(ids, use_cache=False).logits, eager)


# --- state dicts ----------------------------------------------------------------------------------


def test_the_fused_state_dict_round_trips_and_the_checkpoints_names_load_too() -> None:
    fmt = GPTQ(bits=4, group_size=32, sym=False)
    dense, ids = _dense(), _ids()
    fused = _quantized(dense, fmt, fuse=True)
    want = _logits(fused, ids)
    state = fused.state_dict()
    assert any(k.endswith("self_attn.qkv_proj._extra_state") for k in state)
    assert not any(".q_proj." in k or ".gate_proj." in k for k in state)
    other = _quantized(_dense(seed=5), fmt, fuse=True)
    other.load_state_dict(state)
    assert torch.equal(_logits(other, ids), want)
    # The checkpoint's own names: each projection's format tensors under its name.
    checkpoint = {k: v for k, v in state.items() if ".qkv_proj." not in k and ".gate_up_proj." not in k}
    for name, module in dense.named_modules():
        if name.rpartition(".")[2] in PARTS:
            tensors = fmt.quantize(module.weight.detach().float())
            checkpoint.update({f"{name}.{leaf}": t for leaf, t in tensors.items()})
    into = _quantized(_dense(seed=5), fmt, fuse=True)
    result = into.load_state_dict(checkpoint)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(_logits(into, ids), want)
    # A group with a part missing, or an unfused model's prepared state, is refused by name.
    partial = {k: v for k, v in checkpoint.items() if not k.startswith("model.layers.1.mlp.up_proj.")}
    with pytest.raises(TensorFormatError, match=r"model\.layers\.1\.mlp\.gate_up_proj: .* of gate_proj but none of "
                                                r"up_proj"):
        _quantized(_dense(), fmt, fuse=True).load_state_dict(partial)
    prepared = _quantized(dense, fmt, fuse=False).state_dict()
    with pytest.raises(TensorFormatError, match=r"model\.layers\.0\.self_attn\.q_proj\._extra_state: .*unfused model"):
        _quantized(_dense(), fmt, fuse=True).load_state_dict(prepared)


def test_a_skeleton_built_on_meta_loads_the_fused_state(tmp_path) -> None:
    fmt = GPTQ(bits=4, group_size=32)
    fused, ids = _quantized(_dense(), fmt, fuse=True), _ids()
    torch.save(fused.state_dict(), tmp_path / "fused.pt")
    state = torch.load(tmp_path / "fused.pt", weights_only=True)
    skeleton = _quantized(_dense(seed=3), fmt, fuse=True).to("meta")
    skeleton.load_state_dict(state, assign=True)
    skeleton.model.rotary_emb = fused.model.rotary_emb  # computed at init, not saved
    assert torch.equal(_logits(skeleton, ids), _logits(fused, ids))


# --- refusals -------------------------------------------------------------------------------------


def _mixed(**formats) -> nn.Module:
    """A model quantized with keep_source, some projections in another format (each
    from its own random draw)."""
    model = _quantized(_dense(), GPTQ(bits=4, group_size=32), fuse=False, keep_source=True)
    for i, (name, fmt) in enumerate(formats.items()):
        dense = _dense().get_submodule(name)
        tensors = dict(fmt.quantize(dense.weight.detach().float(), generator=torch.Generator().manual_seed(i)))
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, fused_module(fmt, tensors, device="cpu", dtype=torch.float32,
                                                                keep_source=True))
    return model


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model.layers.0.self_attn.k_proj": GPTQ(bits=4, group_size=64)},
         r"model\.layers\.0\.self_attn: q_proj, k_proj, v_proj: q_proj is gptq4-g32-sym, k_proj is gptq4-g64-sym "
         r"\(group_size 32 vs 64\)"),
        ({"model.layers.1.mlp.up_proj": GPTQ(bits=8, group_size=32)},
         r"model\.layers\.1\.mlp: gate_proj, up_proj: gate_proj is gptq4-g32-sym, up_proj is gptq8-g32-sym \(bits 4 vs 8\)"),
        ({"model.layers.1.mlp.up_proj": AWQ(group_size=32)}, r"up_proj is awq4-g32 \(format gptq vs awq\)"),
        ({"model.layers.0.mlp.gate_proj": GPTQ(bits=4, group_size=32, desc_act=True),
          "model.layers.0.mlp.up_proj": GPTQ(bits=4, group_size=32, desc_act=True)},
         r"model\.layers\.0\.mlp: gate_proj, up_proj: FusionError: .*g_idx is not cut along N.*up_proj's differs"),
        ("dense", r"model\.layers\.0\.self_attn: q_proj, k_proj, v_proj: v_proj is Linear, not a quantized linear"),
        ("device", r"model\.layers\.0\.self_attn: q_proj, k_proj, v_proj: devices differ \(q_proj on cpu, k_proj on meta\)"),
        ("dtype", r"activation dtypes differ \(gate_proj torch\.float32, up_proj torch\.bfloat16\)"),
        ("no_source", r"model\.layers\.0\.mlp\.gate_proj: holds only aten_cpu's prepared layout"),
    ],
    ids=["group_size", "bits", "format", "g_idx", "dense", "device", "dtype", "no_source"],
)
def test_groups_that_cannot_be_fused_are_refused_naming_the_layers_and_nothing_changes(change, message) -> None:
    if isinstance(change, dict):
        model = _mixed(**change)
    else:
        model = _mixed()
        if change == "dense":
            model.model.layers[0].self_attn.v_proj = nn.Linear(128, 64)
        elif change == "device":
            model.model.layers[0].self_attn.k_proj.to("meta")
        elif change == "dtype":
            up = _dense().model.layers[1].mlp.up_proj
            model.model.layers[1].mlp.up_proj = fused_module(
                GPTQ(bits=4, group_size=32), GPTQ(bits=4, group_size=32).quantize(up.weight.detach().float()),
                device="cpu", dtype=torch.bfloat16, keep_source=True)
        else:
            model.model.layers[0].mlp.gate_proj = _quantized(_dense(), GPTQ(bits=4, group_size=32), fuse=False
                                                             ).model.layers[0].mlp.gate_proj
    before = {n: type(m) for n, m in model.named_modules()}
    with pytest.raises(FusionError, match=message):
        quantcore.fuse_projections(model)
    assert {n: type(m) for n, m in model.named_modules()} == before
    # Not strict: one warning naming the group, every other group fused.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fused = quantcore.fuse_projections(model, strict=False)
    (warning,) = [w for w in caught if issubclass(w.category, QuantCoreWarning)]
    assert "1 of 4 groups of projections left unfused" in str(warning.message)
    refused_parts = 3 if "self_attn: q_proj" in message else 2
    assert len(fused) == 3 and sum(isinstance(m, FusedSlice) for m in model.modules()) == 10 - refused_parts


def test_a_model_without_fusable_groups_is_left_as_it_was() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))
    quantcore.quantize_(model, GPTQ(bits=4, group_size=32), dtype=torch.float32, fuse=True)
    state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()}
    assert quantcore.fuse_projections(model) == []
    assert [type(m) for m in model] == [QuantLinear, nn.ReLU, QuantLinear]
    assert model.state_dict().keys() == state.keys()
    dense = _dense()  # dense projections only: not fusion's business, and not an error
    assert quantcore.fuse_projections(dense) == [] and _calls(dense) == 0


def test_quantize_fuse_warns_once_for_groups_it_cannot_fuse_and_quantizes_their_layers() -> None:
    dense = _dense()
    dense.model.layers[1].self_attn.qkv_proj = nn.Identity()  # in the way of the fused name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = _quantized(dense, GPTQ(bits=4, group_size=32), fuse=True)
    (warning,) = [w for w in caught if issubclass(w.category, QuantCoreWarning)]
    assert ("quantize_: 1 of 4 groups of projections left unfused: model.layers.1.self_attn: q_proj, k_proj, v_proj "
            "(model.layers.1.self_attn already has an attribute 'qkv_proj')") in str(warning.message)
    assert isinstance(model.model.layers[1].self_attn.q_proj, QuantLinear) and _calls(model) == 4 + 6
    with pytest.raises(quantcore.InvalidArgumentError, match=r"groups: each group is two or more distinct"):
        quantcore.fuse_projections(model, groups=[("q_proj",)])


def test_fused_group_name_joins_the_stems() -> None:
    assert FusionGroup("a", ("q_proj", "k_proj", "v_proj")).fused_leaf == "qkv_proj"
    assert FusionGroup("a", ("gate_proj", "up_proj")).fused_leaf == "gate_up_proj"
    assert FusionGroup("", ("query", "key", "value")).fused_name == "query_key_value"
    assert FusionGroup("b", ("w1", "w3")).fused_leaf == "w1_w3"
