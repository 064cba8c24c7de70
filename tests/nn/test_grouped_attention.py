"""The model_decode harness's attention: a decode step's grouped query heads packed onto
their KV head (no K/V repeat). It equals transformers' sdpa attention and a plain float
softmax(QKᵀ·scale + mask)·V over repeated heads, for a single query token (packed) and
for every other call (handed to transformers' sdpa); a model :func:`random_llama` builds
uses it in every copy, compiles without a graph break and gives the sdpa model's logits;
and its compiled decode step's attention reads the unrepeated cache."""

from __future__ import annotations

import copy
import math
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

from quantcore.benchmarks import grouped_attention  # noqa: E402
from quantcore.benchmarks.grouped_attention import grouped_sdpa_attention  # noqa: E402

B, HKV, S, D = 3, 2, 11, 16


class _Attention(nn.Module):
    """What transformers' sdpa attention reads off the module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               scale: float) -> torch.Tensor:
    """softmax(QKᵀ·scale + mask)·V in float64, K and V repeated to one head per query
    head (head h reads KV head h // G); ``[B, L, Hq, D]``."""
    groups = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(groups, dim=1) for t in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores + (torch.where(mask, 0.0, -math.inf) if mask.dtype == torch.bool else mask.double())
    return (scores.softmax(-1) @ v).transpose(1, 2)


def _mask(kind: str, heads: int, length: int, gen: torch.Generator) -> torch.Tensor | None:
    if kind == "none":
        return None
    keep = torch.rand(B, heads, length, S, generator=gen) < 0.6
    keep[..., int(torch.randint(0, S, (1,), generator=gen))] = True  # every row attends somewhere
    if kind == "bool":
        return keep
    bias = torch.randn(B, heads, length, S, generator=gen)
    return torch.where(keep, bias, torch.finfo(torch.float32).min)


def _sdpa_key_shapes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The key shape of every ``scaled_dot_product_attention`` call from now on."""
    seen: list[tuple[int, ...]] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(tuple(key.shape))
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


@pytest.fixture
def delegated(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per call handed to transformers' ``sdpa_attention_forward``."""
    calls: list[int] = []

    def spy(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        calls.append(1)
        return sdpa_attention_forward(*args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(grouped_attention, "_sdpa_forward", spy)
    return calls


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
@pytest.mark.parametrize("length", [1, 5])
@pytest.mark.parametrize("groups", [4, 1])
def test_it_equals_transformers_sdpa_and_the_float_reference(monkeypatch: pytest.MonkeyPatch, delegated: list[int],
                                                             groups: int, length: int, mask_kind: str) -> None:
    gen = torch.Generator().manual_seed(100 * groups + 10 * length + len(mask_kind))
    heads = HKV * groups
    q = torch.randn(B, heads, length, D, generator=gen)
    k, v = torch.randn(B, HKV, S, D, generator=gen), torch.randn(B, HKV, S, D, generator=gen)
    mask = _mask(mask_kind, 1, length, gen)
    module, scale = _Attention(groups), D**-0.5
    keys = _sdpa_key_shapes(monkeypatch)
    # Not causal: without a mask, transformers' causal path would attend the first L keys only.
    got, weights = grouped_sdpa_attention(module, q, k, v, mask, scaling=scale, is_causal=False)
    assert weights is None and got.shape == (B, length, heads, D) and got.is_contiguous()
    # Packed (one query token, grouped heads): one SDPA call on the KV heads as they are;
    # otherwise transformers' sdpa ran.
    packed = length == 1 and groups > 1
    assert delegated == ([] if packed else [1])
    if packed:
        assert keys == [(B, HKV, S, D)], keys
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=scale, is_causal=False)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.double(), _reference(q, k, v, mask, scale), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["per-head mask", "position bias"])
def test_what_packing_cannot_carry_goes_to_transformers_sdpa(delegated: list[int], case: str) -> None:
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(B, 4 * HKV, 1, D, generator=gen)
    k, v = torch.randn(B, HKV, S, D, generator=gen), torch.randn(B, HKV, S, D, generator=gen)
    mask = _mask("bool", 4 * HKV if case == "per-head mask" else 1, 1, gen)
    extra = {"position_bias": torch.randn(B, 4 * HKV, 1, S, generator=gen)} if case == "position bias" else {}
    got, _ = grouped_sdpa_attention(_Attention(4), q, k, v, mask, scaling=0.3, **extra)
    assert delegated == [1]
    want, _ = sdpa_attention_forward(_Attention(4), q, k, v, mask, scaling=0.3, **extra)
    assert torch.equal(got, want)


def test_an_old_transformers_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "transformers.masking_utils", None)  # as if it had none
    with pytest.raises(MissingDependencyError, match=r"expected transformers with AttentionInterface and "
                                                     r"masking_utils\.AttentionMaskInterface/sdpa_mask \(5\.x\), "
                                                     rf"got transformers {re.escape(transformers.__version__)}"):
        grouped_attention.register()


# --- in the harness's model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny() -> tuple[dict[str, int], nn.Module]:
    """The suite's tiny dims at batch 2, in float32, built by the harness."""
    from quantcore.benchmarks.decode import random_llama
    from quantcore.benchmarks.suites import model_decode

    dims = {**model_decode.SHAPES["tiny"][0], "B": 2}
    assert dims["NH"] > dims["NKV"]  # grouped heads, else there is nothing to pack
    return dims, random_llama(dims, "cpu", torch.float32)


def test_every_copy_of_the_harness_model_uses_it(tiny: tuple[dict[str, int], nn.Module]) -> None:
    from quantcore.benchmarks.decode import quantized_copy, reference_copy
    from quantcore.benchmarks.suites.model_decode import GPTQ4

    _, model = tiny
    copies = [model, reference_copy(model), reference_copy(model, GPTQ4), quantized_copy(model, GPTQ4)]
    for m in copies:
        assert m.config._attn_implementation == grouped_attention.NAME
        assert {layer.self_attn.config._attn_implementation for layer in m.model.layers} == {grouped_attention.NAME}


def _decoder(model: nn.Module, dims: dict[str, int]) -> Any:
    from quantcore.benchmarks.decode import Decoder

    return Decoder(model, batch=dims["B"], prompt=dims["P"], new_tokens=dims["T"], device="cpu", compile=False)


def _compiled_logits(model: nn.Module, dims: dict[str, int], token: torch.Tensor,
                     backend: str | Callable[..., Any] = "aot_eager") -> torch.Tensor:
    """The first decode step's logits after the prompt, through ``torch.compile(fullgraph=True)``."""
    from quantcore.benchmarks.decode import _rewind

    decoder = _decoder(model, dims)
    step = torch.compile(decoder._logits, backend=backend, fullgraph=True)
    _rewind(decoder.cache, dims["P"])
    with torch.no_grad():
        return step(token, decoder.positions[0]).float()  # type: ignore[no-any-return]


def test_compiled_logits_equal_the_sdpa_models(tiny: tuple[dict[str, int], nn.Module]) -> None:
    dims, model = tiny
    sdpa = copy.deepcopy(model)
    sdpa.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == grouped_attention.NAME
    token = torch.randint(0, dims["V"], (dims["B"], 1), generator=torch.Generator().manual_seed(3))
    got = _compiled_logits(model, dims, token)
    torch._dynamo.reset()
    for want in (_compiled_logits(sdpa, dims, token), _decoder(sdpa, dims).step_logits(token)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def _attention_in_graph(model: nn.Module, dims: dict[str, int]) -> tuple[list[tuple[int, ...]], int]:
    """From the compiled decode step's graph: the key shape of each attention call, and
    how many ``expand`` calls make a 5-D tensor (``repeat_kv``'s copy of K or V)."""
    graphs: list[torch.fx.GraphModule] = []

    def recording(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)

    token = torch.zeros(dims["B"], 1, dtype=torch.long)
    _compiled_logits(model, dims, token, backend=recording)
    torch._dynamo.reset()
    assert len(graphs) == 1  # fullgraph: one graph for the whole step
    keys, expands = [], 0
    for node in graphs[0].graph.nodes:
        value = node.meta.get("example_value")
        if node.op == "call_function" and "scaled_dot_product_attention" in str(node.target):
            keys.append(tuple(node.args[1].meta["example_value"].shape))
        elif node.target == "expand" and isinstance(value, torch.Tensor) and value.dim() == 5:
            expands += 1
    return keys, expands


def test_the_compiled_decode_step_reads_each_kv_head_once(tiny: tuple[dict[str, int], nn.Module]) -> None:
    dims, model = tiny
    cache = (dims["B"], dims["NKV"], dims["P"] + dims["T"], dims["H"] // dims["NH"])
    keys, expands = _attention_in_graph(model, dims)
    assert keys == [cache] * dims["L"] and expands == 0, (keys, expands)
    # The same check sees the repeat where transformers' sdpa makes one under compile.
    sdpa = copy.deepcopy(model)
    sdpa.set_attn_implementation("sdpa")
    keys, expands = _attention_in_graph(sdpa, dims)
    assert keys == [(dims["B"], dims["NH"], *cache[2:])] * dims["L"] and expands == 2 * dims["L"], (keys, expands)
