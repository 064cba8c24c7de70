"""Every format's shards, at the format level: each shard is a valid tensor set of its
format whose golden dequantization is exactly the matching slice of the whole layer's,
and the set of shards puts the layer back together bit for bit."""

from __future__ import annotations

import pytest
import torch

from quantcore.errors import ShardError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.formats.sharding import Part, check_shards, unshard
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.formats.turboquant import TurboQuant

LINEAR_FORMATS = [
    GPTQ(bits=4, group_size=128, sym=True),
    GPTQ(bits=4, group_size=128, sym=False, desc_act=True),
    GPTQ(bits=4, group_size=32, sym=False, desc_act=True, static_groups=True),
    GPTQ(bits=4, group_size=-1, sym=False, desc_act=True, checkpoint_format="v1"),
    GPTQ(bits=2, group_size=64, sym=False, desc_act=True),
    GPTQ(bits=3, group_size=128, sym=False, checkpoint_format="v1"),
    GPTQ(bits=3, group_size=32, sym=True, desc_act=True),
    GPTQ(bits=8, group_size=128, sym=False, desc_act=True),
    GPTQ(bits=8, group_size=512, sym=True),  # one group as long as K
    GPTQ(bits=2, group_size=64, pack_dtype=torch.int8),
    GPTQ(bits=4, group_size=64, sym=False, pack_dtype=torch.int16),
    GPTQ(bits=8, group_size=64, pack_dtype=torch.int64),
    AWQ(group_size=128),
    AWQ(group_size=32, zero_point=False),
    AWQ(group_size=-1),
    TurboQuant(),
    TurboQuant(residual=True),
    TurboQuant(group_size=64, residual=True, rotation_per_group=True),
    TurboQuant(bits=3, group_size=64, norm_dtype=torch.float32),
]
K, N = 512, 256


@pytest.fixture(scope="module", params=LINEAR_FORMATS, ids=lambda f: f.slug)
def linear_layer(request):
    fmt = request.param
    gen = torch.Generator().manual_seed(7)
    tensors = dict(fmt.quantize(torch.randn(N, K, generator=gen) * 0.05, generator=gen))
    tensors["bias"] = torch.randn(N, generator=gen).to(torch.float16)
    return fmt, tensors, fmt.dequantize(tensors)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("dim", ["K", "N"])
def test_linear_shards_dequantize_to_the_slice_and_reassemble(linear_layer, dim, world):
    fmt, tensors, dense = linear_layer
    shards = [fmt.shard(tensors, dim=dim, rank=r, world=world) for r in range(world)]
    size = (K if dim == "K" else N) // world
    for s in shards:
        assert (s.start, s.stop, s.total, s.dim, s.world) == (s.rank * size, (s.rank + 1) * size, size * world, dim, world)
        dims = s.format.validate(s.tensors)
        assert dims == ({"K": size, "N": N} if dim == "K" else {"K": K, "N": size})
        want = dense[:, s.start : s.stop] if dim == "K" else dense[s.start : s.stop]
        assert torch.equal(s.format.dequantize(s.tensors), want)
        if dim == "K":  # the bias is added once, after the sum
            assert ("bias" in s.tensors) == (s.rank == 0)
        else:
            assert torch.equal(s.tensors["bias"], tensors["bias"][s.start : s.stop])
    back = unshard(shards)
    assert back.keys() == tensors.keys()
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name


def test_cut_tensors_own_their_memory(linear_layer):
    """A shard must not keep the whole layer alive through a view."""
    fmt, tensors, _ = linear_layer
    s = fmt.shard(tensors, dim="N", rank=1, world=2)
    for name, part in s.parts.items():
        if part.axis is not None and name in s.tensors:
            assert s.tensors[name].untyped_storage().data_ptr() != tensors[name].untyped_storage().data_ptr(), name
            assert s.tensors[name].is_contiguous()


def test_act_order_row_shards_keep_every_group_and_global_g_idx():
    fmt = GPTQ(bits=4, group_size=128, sym=False, desc_act=True)
    gen = torch.Generator().manual_seed(3)
    t = fmt.quantize(torch.randn(64, 512, generator=gen), generator=gen)
    s = fmt.shard(t, dim="K", rank=1, world=4)
    assert s.format.group_size == 32 and s.format.desc_act  # 4 groups over 128 inputs
    assert torch.equal(s.tensors["scales"], t["scales"]) and torch.equal(s.tensors["qzeros"], t["qzeros"])
    assert torch.equal(s.tensors["g_idx"], t["g_idx"][128:256])
    assert s.parts["scales"] == Part() and s.parts["g_idx"] == Part(axis=0)


def test_plain_row_shards_renumber_g_idx_from_zero():
    fmt = GPTQ(bits=4, group_size=64)
    t = fmt.quantize(torch.randn(64, 512))
    s = fmt.shard(t, dim="K", rank=3, world=4)
    assert torch.equal(s.tensors["g_idx"], torch.arange(128, dtype=torch.int32) // 64)
    assert s.parts["g_idx"].offset == 6 and torch.equal(s.tensors["scales"], t["scales"][6:8])


@pytest.mark.parametrize("fmt", [TRTLLMMoE(group_size=64), TRTLLMMoE(group_size=128, sym=False, scale_dtype=torch.bfloat16)],
                         ids=lambda f: f.slug)
@pytest.mark.parametrize("dim", ["E", "K", "N"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_moe_shards_dequantize_to_the_slice(fmt, dim, world):
    gen = torch.Generator().manual_seed(5)
    t = fmt.quantize(torch.randn(4, 512, 128, generator=gen))
    dense = fmt.dequantize(t)
    shards = [fmt.shard(t, dim=dim, rank=r, world=world) for r in range(world)]
    axis = "EKN".index(dim)
    for s in shards:
        assert torch.equal(s.format.dequantize(s.tensors), dense.narrow(axis, s.start, s.size))
    back = unshard(shards)
    assert all(torch.equal(back[n], t[n]) for n in t) and back.keys() == t.keys()


@pytest.mark.parametrize("fp4", [True, False])
@pytest.mark.parametrize("world", [2, 4])
def test_svdquant_channel_shards_quantize_like_the_whole(fp4, world):
    """Codes of each channel slice are the whole activation's codes for those channels."""
    fmt = SVDQuantAct(fp4=fp4)
    gen = torch.Generator().manual_seed(2)
    n = 256
    tensors = {"lora_down": torch.randn(n, 8, generator=gen).to(torch.bfloat16),
               "smooth": torch.exp(torch.randn(n, generator=gen) * 0.3).to(torch.bfloat16)}
    x = (torch.randn(3, n, generator=gen) * 2).to(torch.bfloat16)
    whole = fmt.quantize(x, smooth=tensors["smooth"])
    shards = [fmt.shard(tensors, dim="N", rank=r, world=world) for r in range(world)]
    parts = [fmt.quantize(x[:, s.start : s.stop].contiguous(), smooth=s.tensors["smooth"]) for s in shards]
    assert torch.equal(torch.cat([p["qout"] for p in parts], dim=1), whole["qout"])
    assert torch.equal(torch.cat([p["oscales"] for p in parts], dim=0).view(torch.uint8), whole["oscales"].view(torch.uint8))
    assert all(torch.equal(unshard(shards)[k], tensors[k]) for k in tensors)


ACT_ORDER = [
    GPTQ(bits=4, group_size=128, sym=False, desc_act=True),
    GPTQ(bits=3, group_size=32, sym=True, desc_act=True),
    GPTQ(bits=2, group_size=64, desc_act=True, pack_dtype=torch.int8),
    GPTQ(bits=8, group_size=64, sym=False, desc_act=True, pack_dtype=torch.int64, checkpoint_format="v1"),
]


@pytest.mark.parametrize("fmt", ACT_ORDER, ids=lambda f: f.slug)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_act_order_by_whole_groups_and_the_columns_that_feed_it(fmt, world):
    gen = torch.Generator().manual_seed(11)
    down = dict(fmt.quantize(torch.randn(64, 512, generator=gen), generator=gen))
    down["bias"] = torch.randn(64, generator=gen).to(torch.float16)
    up = fmt.quantize(torch.randn(512, 256, generator=gen), generator=gen)
    dense_down, dense_up = fmt.dequantize(down), fmt.dequantize(up)
    assert fmt.shard_rules("K") == ("replicate", "groups") and fmt.shard_rules("N") == ()
    rows = [fmt.shard(down, dim="K", rank=r, world=world, rule="groups") for r in range(world)]
    check_shards(rows)
    groups = 512 // fmt.group_size
    for s in rows:
        g0, per = s.rank * groups // world, groups // world
        assert s.format == fmt  # the layer's group size: whole groups, nothing replicated
        assert torch.equal(s.tensors["scales"], down["scales"][g0 : g0 + per])
        assert torch.equal(torch.unique(down["g_idx"][s.index]), torch.arange(g0, g0 + per, dtype=torch.int32))
        assert torch.equal(s.index, s.index.sort().values)
        assert torch.equal(s.format.dequantize(s.tensors), dense_down[:, s.index])
        assert ("bias" in s.tensors) == (s.rank == 0)
    cols = [fmt.shard(up, dim="N", rank=r, world=world, index=s.index) for r, s in enumerate(rows)]
    check_shards(cols)
    for c in cols:
        assert torch.equal(c.format.dequantize(c.tensors), dense_up[c.index])
    with pytest.raises(ShardError, match="unshard puts back range shards only"):
        unshard(rows)
    # the default rule is vLLM's replicated one, asked for by name too
    assert torch.equal(fmt.shard(down, dim="K", rank=0, world=world, rule="replicate").tensors["scales"], down["scales"])


def test_rule_and_index_refusals():
    act = ACT_ORDER[0]
    t = act.quantize(torch.randn(64, 512), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ShardError, match=r"rule: expected one of \[\] for dim=K, got 'groups'"):
        GPTQ(bits=4, group_size=128).shard(GPTQ(bits=4, group_size=128).quantize(torch.randn(64, 512)),
                                           dim="K", rank=0, world=2, rule="groups")
    with pytest.raises(ShardError, match=r"groups = 4 over world=8: 8 does not divide 4"):
        act.shard(t, dim="K", rank=0, world=8, rule="groups")
    uneven = dict(t)
    uneven["g_idx"] = torch.where(t["g_idx"] == 1, 0, t["g_idx"]).to(torch.int32)
    with pytest.raises(ShardError, match="rule 'groups' needs every group to hold group_size=128 inputs; group 0 holds 256"):
        act.shard(uneven, dim="K", rank=0, world=2, rule="groups")
    awq = AWQ()
    with pytest.raises(ShardError, match="index: only a column"):
        awq.shard(awq.quantize(torch.randn(64, 128)), dim="N", rank=0, world=2, index=torch.arange(32))
    with pytest.raises(ShardError, match="index: only a column"):
        act.shard(t, dim="K", rank=0, world=2, index=torch.arange(32))
    for bad, words in [(torch.arange(12), "12 outputs, expected a positive multiple of 8"),
                       (torch.tensor([0] * 8), "with 7 repeated"),
                       (torch.arange(60, 68), r"values in \[60, 67\]"),
                       (torch.arange(8.0), "1-D integer tensor")]:
        with pytest.raises(ShardError, match=words):
            act.shard(t, dim="N", rank=0, world=2, index=bad)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_moe_gated_ffn_cut_by_halves_sums_to_the_whole(world):
    """TensorRT-LLM's gated FFN: W1 [E, K, 2·I] cut half by half (SwiGLU pairs on one
    rank), W2 [E, I, K] cut along its K; the ranks' FFN outputs sum to the whole's."""
    from quantcore.backends.trtllm_moe import TorchMoE
    from quantcore.formats.sharding import merged_index
    from quantcore.ops.moe import moe_ffn

    fmt = TRTLLMMoE(group_size=64, sym=False, scale_dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(9)
    e, k, inter = 4, 128, 256
    w1 = fmt.quantize(torch.randn(e, k, 2 * inter, generator=gen) * 0.05)
    w2 = fmt.quantize(torch.randn(e, inter, k, generator=gen) * 0.05)
    x = torch.randn(6, k, generator=gen).to(torch.bfloat16)
    ids = torch.rand(6, e, generator=gen).argsort(1)[:, :2].to(torch.int32)
    weights = torch.softmax(torch.randn(6, 2, generator=gen), -1)
    kernel = TorchMoE(fmt, "cpu")
    whole = moe_ffn(kernel, x, ids, weights, kernel.prepare(w1), kernel.prepare(w2))
    parts = []
    for rank in range(world):
        index = merged_index((inter, inter), rank, world)
        s1 = fmt.shard(w1, dim="N", rank=rank, world=world, index=index)
        s2 = fmt.shard(w2, dim="K", rank=rank, world=world)
        assert torch.equal(s1.format.dequantize(s1.tensors), fmt.dequantize(w1)[..., index])
        parts.append(moe_ffn(kernel, x, ids, weights, kernel.prepare(s1.tensors), kernel.prepare(s2.tensors)))
    total = parts[0].clone()
    for p in parts[1:]:
        total += p
    from quantcore.conformance.tolerance import compare, tolerance_for

    verdict = compare(total, whole.double(), tolerance_for(torch.bfloat16))
    assert verdict.ok, verdict.problem
    check_shards([fmt.shard(w1, dim="N", rank=r, world=world, index=merged_index((inter, inter), r, world))
                  for r in range(world)])
