"""compressed-tensors pack-quantized checkpoints, written by the ``compressed-tensors``
package (:mod:`.writer`), loaded by both entry points: every layer's weight bit-exact to
the package's own dequantization, every layer's forward within the kernel tolerance of the
float64 golden linear, the ignored layers left dense, and the whole model's logits close
to the same model run with the writer's dequantized weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from quantcore.checkpoint import load_checkpoint
from quantcore.checkpoint.load import load_quantized
from quantcore.nn.linear import QuantLinear
from quantcore.ops.linear import linear_reference
from quantcore.ops.tolerance import judge_output

from .writer import scheme, tiny_llama, write_checkpoint, writer_dequantized

pytest.importorskip("safetensors")
pytest.importorskip("transformers")

ATTN, MLP = r"re:.*self_attn\.", r"re:.*mlp\."
#: name → (config groups, ignore, {layer: expected GPTQ slug} for layers checked by name)
CASES = {
    "w4-g32-sym": ({"g": scheme(4, 32)}, ["lm_head"], {"model.layers.0.mlp.up_proj": "gptq4-g32-sym"}),
    "w4-g32-asym": ({"g": scheme(4, 32, sym=False)}, ["lm_head"], {"model.layers.1.self_attn.o_proj": "gptq4-g32-asym"}),
    "w8-channel-sym": ({"g": scheme(8, None)}, ["lm_head"], {"model.layers.0.mlp.down_proj": "gptq8-gall-sym"}),
    "w8-channel-asym": ({"g": scheme(8, None, sym=False)}, ["lm_head"], {"model.layers.0.mlp.down_proj": "gptq8-gall-asym"}),
    "w4-g32-asym-actorder": ({"g": scheme(4, 32, sym=False, actorder=True)}, ["lm_head"],
                             {"model.layers.1.mlp.gate_proj": "gptq4-g32-asym-act"}),
    "w8-g32-sym-actorder": ({"g": scheme(8, 32, actorder=True)}, ["lm_head"],
                            {"model.layers.0.self_attn.k_proj": "gptq8-g32-sym-act"}),
    # Per-group settings: a regex per block, an exact name that beats its regex, a regex
    # in ignore, and the lm_head left dense by name.
    "mixed-groups": (
        {"attn": scheme(8, None, targets=[ATTN]), "mlp": scheme(4, 32, sym=False, targets=[MLP]),
         "one": scheme(4, 64, targets=["model.layers.1.mlp.down_proj"])},
        ["lm_head", r"re:.*layers\.0\.self_attn\.o_proj"],
        {"model.layers.0.self_attn.q_proj": "gptq8-gall-sym", "model.layers.0.mlp.up_proj": "gptq4-g32-asym",
         "model.layers.1.mlp.down_proj": "gptq4-g64-sym", "model.layers.0.self_attn.o_proj": "dense",
         "lm_head": "dense"},
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def written(request, tmp_path_factory) -> tuple[Path, dict[str, str], nn.Module]:
    groups, ignore, expected = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    write_checkpoint(folder, tiny_llama(), groups, ignore=ignore)
    return folder, expected, tiny_llama()


def test_load_checkpoint_is_bit_exact_to_the_writer(written) -> None:
    folder, expected, _ = written
    reference = writer_dequantized(folder)
    ckpt = load_checkpoint(folder)
    assert sorted(ckpt.linears) == sorted(reference)
    for name, tensors in ckpt.linears.items():
        fmt = ckpt.format_of(name)
        got = fmt.dequantize(tensors).to(reference[name].dtype)
        assert torch.equal(got, reference[name]), name
    for name, slug in expected.items():
        assert (ckpt.format_of(name).slug if name in ckpt.linears else "dense") == slug, name


def _reference_model(folder: Path, dense: nn.Module) -> nn.Module:
    """The written model with every quantized weight replaced by the writer's dequantization."""
    modules = dict(dense.named_modules())
    with torch.no_grad():
        for name, weight in writer_dequantized(folder).items():
            modules[name].weight.copy_(weight)
    return dense


def test_load_quantized_runs_every_layer_within_the_kernel_tolerance(written) -> None:
    folder, expected, dense = written
    reference = writer_dequantized(folder)
    model = load_quantized(folder, dtype=torch.bfloat16)
    modules = dict(model.named_modules())
    for name, slug in expected.items():
        module = modules[name]
        assert (module.format.slug if isinstance(module, QuantLinear) else "dense") == slug, name
        assert isinstance(module, QuantLinear) == (slug != "dense"), name
    gen = torch.Generator().manual_seed(1)
    for name, weight in reference.items():
        layer = modules[name]
        assert isinstance(layer, QuantLinear), name
        x = torch.randn(3, layer.in_features, generator=gen).to(torch.bfloat16)
        verdict = judge_output(layer(x), linear_reference(x, weight.double()), torch.bfloat16)
        assert verdict.ok, f"{name} ({layer.kernel.name}): {verdict.problem}"
    # The whole model: the same logits as the written model run with the writer's weights.
    ref_model = _reference_model(folder, _load_dense_rest(folder, dense))
    ids = torch.randint(0, 128, (2, 12), generator=gen)
    with torch.no_grad():
        got, want = model(ids).logits.float(), ref_model(ids).logits.float()
    assert ((got - want).norm() / want.norm()).item() < 2e-2


def _load_dense_rest(folder: Path, dense: nn.Module) -> nn.Module:
    """``dense`` with the checkpoint's unquantized tensors (embeddings, norms, lm_head)."""
    from safetensors.torch import load_file

    tensors = {}
    for file in folder.glob("*.safetensors"):
        tensors.update(load_file(str(file)))
    state = {k: v for k, v in tensors.items() if k in dict(dense.state_dict())}
    dense.load_state_dict(state, strict=False)
    return dense
