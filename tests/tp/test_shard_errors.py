"""Bad shard requests and inconsistent shard sets: refused by name, with what would work."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from quantcore.errors import InvalidArgumentError, ShardError, TensorFormatError
from quantcore.formats.awq import AWQ
from quantcore.formats.base import Format
from quantcore.formats.gptq import GPTQ
from quantcore.formats.sharding import check_shards, even_split, unshard, working_worlds
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.formats.turboquant import TurboQuant

G128 = GPTQ(bits=4, group_size=128, sym=False)


@pytest.fixture(scope="module")
def layer():
    gen = torch.Generator().manual_seed(0)
    return G128.quantize(torch.randn(256, 512, generator=gen), generator=gen)


def test_shard_error_is_an_invalid_argument():
    assert issubclass(ShardError, InvalidArgumentError) and issubclass(ShardError, ValueError)


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"dim": "M", "rank": 0, "world": 2}, r"dim: expected one of 'K', 'N', got 'M'"),
    ({"dim": "E", "rank": 0, "world": 2}, r"dim: expected one of 'K', 'N', got 'E'"),
    ({"dim": "K", "rank": 2, "world": 2}, r"rank: expected an int in \[0, 2\) for world=2, got 2"),
    ({"dim": "K", "rank": -1, "world": 2}, r"rank: expected an int in \[0, 2\) for world=2, got -1"),
    ({"dim": "K", "rank": True, "world": 2}, r"rank: expected an int .* got True"),
    ({"dim": "K", "rank": 0, "world": 0}, r"world: expected an int >= 1, got 0"),
    ({"dim": "K", "rank": 0, "world": 2.0}, r"world: expected an int >= 1, got 2.0"),
])
def test_bad_requests_are_refused_by_name(layer, kwargs, pattern):
    with pytest.raises(ShardError, match=pattern):
        G128.shard(layer, **kwargs)


def test_a_world_that_does_not_divide_lists_the_worlds_that_do(layer):
    with pytest.raises(ShardError) as info:
        G128.shard(layer, dim="N", rank=0, world=3)
    assert "gptq4-g128-asym shard: N = 256 over world=3: 3 does not divide 256" in str(info.value)
    assert "world ∈ {1, 2, 4, 8, 16, 32}" in str(info.value)  # whole lanes of 8 outputs


def test_a_cut_inside_a_group_names_the_group_and_the_worlds_that_work(layer):
    with pytest.raises(ShardError) as info:
        G128.shard(layer, dim="K", rank=0, world=8)
    msg = str(info.value)
    assert "K = 512 over world=8: a part of 64 is not a multiple of 128 (whole groups of 128 inputs" in msg
    assert "world ∈ {1, 2, 4} (parts of 512, 256, 128)" in msg


@pytest.mark.parametrize(("fmt", "shape", "dim", "world", "words"), [
    (GPTQ(bits=3, group_size=32), (64, 512), "N", 4, "qzeros packs outputs: 3-bit codes pack 32 per 3 32-bit lane(s)"),
    (GPTQ(bits=4, group_size=128, desc_act=True), (64, 384), "K", 3, "act-order keeps all 3 groups on every rank"),
    (AWQ(group_size=32), (48, 256), "N", 4, "pack 8 outputs per int32 lane"),
    (TurboQuant(group_size=128), (16, 256), "K", 4, "a rotation mixes its group's inputs"),
])
def test_cuts_off_a_boundary_are_refused_by_name(fmt, shape, dim, world, words):
    tensors = fmt.quantize(torch.randn(*shape), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ShardError, match=re.escape(words)):
        fmt.shard(tensors, dim=dim, rank=0, world=world)


def test_moe_and_svdquant_refusals():
    moe = TRTLLMMoE(group_size=128)
    t = moe.quantize(torch.randn(2, 256, 64))
    with pytest.raises(ShardError, match=r"K = 256 over world=4: a part of 64 is not a multiple of 128 \(whole groups of 128 rows\)"):
        moe.shard(t, dim="K", rank=0, world=4)
    with pytest.raises(ShardError, match=r"E = 2 over world=4: 4 does not divide 2"):
        moe.shard(t, dim="E", rank=0, world=4)
    svd = SVDQuantAct(fp4=False)
    with pytest.raises(ShardError, match=r"whole INT4 scale blocks of 64 channels"):
        svd.shard({"lora_down": torch.zeros(128, 4, dtype=torch.float16)}, dim="N", rank=0, world=4)
    with pytest.raises(ShardError, match=r"dim: expected one of 'N', got 'K'"):
        svd.shard({"lora_down": torch.zeros(128, 4, dtype=torch.float16)}, dim="K", rank=0, world=2)


def test_bad_tensors_are_the_formats_error(layer):
    with pytest.raises(TensorFormatError, match="scales"):
        G128.shard({**layer, "scales": layer["scales"][:1]}, dim="N", rank=0, world=2)


@dataclass(frozen=True)
class _NoShards(Format):
    name: ClassVar[str] = "noshards"

    @property
    def slug(self) -> str:
        return "noshards"

    def validate(self, tensors):
        return {}

    def quantize(self, weight, *, generator=None):
        return {}

    def dequantize(self, tensors, dtype=torch.float64):
        return torch.zeros(0)


def test_a_format_without_shards_says_so():
    with pytest.raises(ShardError, match="the noshards format defines no tensor-parallel shard"):
        _NoShards().shard({}, dim="K", rank=0, world=1)


def test_even_split_and_working_worlds():
    assert even_split("x", "K", 512, 1, 1000, "") == 512  # one rank takes everything, boundaries or not
    assert working_worlds(512, 128) == [1, 2, 4]
    assert working_worlds(96, 1) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]


# --- a set of shards (a pre-sharded checkpoint) --------------------------------------------


def _set(fmt, tensors, dim="K", world=2):
    return [fmt.shard(tensors, dim=dim, rank=r, world=world) for r in range(world)]


def test_check_shards_accepts_a_complete_set(layer):
    check_shards(_set(G128, layer))
    check_shards(list(reversed(_set(G128, layer, "N", 4))))


def test_mixed_group_sizes_on_one_layer_are_refused(layer):
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
    g64 = GPTQ(bits=4, group_size=64, sym=False)
    mixed = [_set(G128, layer)[0], _set(g64, g64.quantize(w))[1]]
    with pytest.raises(ShardError, match=r"rank 1 belongs to another layer format \(group_size 64 vs 128\)"):
        check_shards(mixed)


def test_mixed_formats_on_one_layer_are_refused(layer):
    awq = AWQ(group_size=128)
    other = _set(awq, awq.quantize(torch.randn(256, 512)))[1]
    with pytest.raises(ShardError, match=r"format awq vs gptq"):
        check_shards([_set(G128, layer)[0], other])


def test_incomplete_or_inconsistent_sets_are_refused(layer):
    k2, n2, k4 = _set(G128, layer), _set(G128, layer, "N"), _set(G128, layer, world=4)
    with pytest.raises(ShardError, match=r"expected ranks 0 … 1 once each, got \[0, 0\]"):
        check_shards([k2[0], k2[0]])
    with pytest.raises(ShardError, match=r"cuts N = 256 over world=2, rank 0 cuts K = 512"):
        check_shards([k2[0], n2[1]])
    with pytest.raises(ShardError, match=r"over world=4"):
        check_shards([k2[0], k4[1]])
    act = GPTQ(bits=4, group_size=128, sym=False, desc_act=True)
    a2 = _set(act, act.quantize(torch.randn(256, 512)), "N")
    forged = dataclasses.replace(a2[1], tensors={**a2[1].tensors, "g_idx": a2[1].tensors["g_idx"].flip(0)})
    with pytest.raises(ShardError, match="g_idx is replicated, but rank 1's differs from rank 0's"):
        check_shards([a2[0], forged])
    broken = dataclasses.replace(n2[1], tensors={**n2[1].tensors, "g_idx": n2[1].tensors["g_idx"].flip(0)})
    with pytest.raises(ShardError, match=r"rank 1: gptq4-g128-asym tensors: g_idx: desc_act=False expects"):
        check_shards([n2[0], broken])
    with pytest.raises(ShardError, match="non-empty sequence of Shard"):
        unshard([])
