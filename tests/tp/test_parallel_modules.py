"""The tensor-parallel modules in one process: the ranks' parts built side by side (no
process group needed for ``partial``), and every refusal they make before a collective."""

from __future__ import annotations

import pytest
import torch

from quantcore.checkpoint.parallel import (
    ColumnParallelQuantLinear,
    ParallelQuantMLP,
    RowParallelQuantLinear,
    TPGroup,
)
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.conformance.tp.processes import golden_linear, mlp_layers
from quantcore.errors import ShardError
from quantcore.formats.gptq import GPTQ

FMT = GPTQ(bits=4, group_size=64, sym=False)


@pytest.fixture(scope="module")
def layers():
    return mlp_layers(FMT, 128, 256)


def test_tp_group_refuses_bad_places():
    with pytest.raises(ShardError, match=r"rank: expected an int in \[0, 2\) for world=2, got 2"):
        TPGroup(2, 2)
    with pytest.raises(ShardError, match="world: expected an int >= 1, got 0"):
        TPGroup(0, 0)
    x = torch.ones(3)
    assert TPGroup(0, 1).all_reduce(x) is x  # one rank: nothing to reduce, no process group needed


def test_tp_group_current_needs_an_initialised_process_group():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(ShardError, match=r"torch\.distributed is not initialised"):
        TPGroup.current()


@pytest.mark.parametrize("world", [2, 4])
def test_column_parts_concatenate_and_row_parts_sum_to_the_layer(layers, world):
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    up, down = layers["mlp.up_proj"], layers["mlp.down_proj"]
    whole_up = ColumnParallelQuantLinear.from_tensors(FMT, up, TPGroup(0, 1), device="cpu")
    cols = [ColumnParallelQuantLinear.from_tensors(FMT, up, TPGroup(r, world), device="cpu") for r in range(world)]
    with torch.no_grad():
        gathered = torch.cat([c(x) for c in cols], dim=-1)
        assert torch.equal(gathered, whole_up(x))  # same dot products, column by column
        h = torch.randn(3, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        rows = [RowParallelQuantLinear.from_tensors(FMT, down, TPGroup(r, world), device="cpu") for r in range(world)]
        total = rows[0].partial(h[:, :256 // world])
        for r, row in enumerate(rows[1:], 1):
            total += row.partial(h[:, r * 256 // world:(r + 1) * 256 // world])
    verdict = compare(total, golden_linear(FMT, down, h), tolerance_for(torch.bfloat16))
    assert verdict.ok, verdict.problem
    assert "bias" in rows[0].shard.tensors and all("bias" not in r.shard.tensors for r in rows[1:])


def test_mlp_refuses_layers_that_do_not_chain(layers):
    bad = dict(layers)
    bad["mlp.down_proj"] = mlp_layers(FMT, 64, 256)["mlp.down_proj"]  # 256 → 64, up is 128 → 256
    named = {k.rsplit(".", 1)[1].removesuffix("_proj"): v for k, v in bad.items()}
    with pytest.raises(ShardError, match=r"down: \{'K': 256, 'N': 64\}, expected K=256 \(up's N\) and N=128 \(up's K\)"):
        ParallelQuantMLP(FMT, named, TPGroup(0, 2))
    with pytest.raises(ShardError, match="expected up, down and optionally gate"):
        ParallelQuantMLP(FMT, {"up": named["up"]}, TPGroup(0, 2))
    with pytest.raises(ShardError, match="activation: expected one of"):
        ParallelQuantMLP(FMT, named, TPGroup(0, 2), activation="tanh")


def test_mlp_refuses_a_world_before_preparing_anything(layers, monkeypatch):
    named = {k.rsplit(".", 1)[1].removesuffix("_proj"): v for k, v in layers.items()}
    prepared = []
    import quantcore.checkpoint.parallel as parallel

    monkeypatch.setattr(parallel, "_local", lambda *a: prepared.append(a) or None)
    with pytest.raises(ShardError, match=r"K = 256 over world=8: a part of 32 is not a multiple of 64"):
        ParallelQuantMLP(FMT, named, TPGroup(0, 8))
    assert prepared == []  # the refusal came before any kernel was bound


def test_from_shards_checks_the_whole_set_and_the_group(layers):
    down = layers["mlp.down_proj"]
    shards = [FMT.shard(down, dim="K", rank=r, world=2) for r in range(2)]
    row = RowParallelQuantLinear.from_shards(shards, TPGroup(1, 2), device="cpu")
    assert row.shard.rank == 1
    with pytest.raises(ShardError, match="made for world=2, this group has 4 ranks"):
        RowParallelQuantLinear.from_shards(shards, TPGroup(1, 4))
    with pytest.raises(ShardError, match="cut along K, this layer needs N"):
        ColumnParallelQuantLinear.from_shards(shards, TPGroup(1, 2))
    with pytest.raises(ShardError, match=r"expected ranks 0 … 1 once each"):
        RowParallelQuantLinear.from_shards([shards[0], shards[0]], TPGroup(0, 2))


@pytest.mark.parametrize("act_order", ["replicate", "groups"])
def test_an_act_order_block_sums_to_the_whole_over_ranks(act_order):
    act = GPTQ(bits=4, group_size=64, sym=False, desc_act=True)
    named = {k.rsplit(".", 1)[1].removesuffix("_proj"): v for k, v in mlp_layers(act, 128, 256).items()}
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    whole = ParallelQuantMLP(act, named, TPGroup(0, 1), act_order=act_order, device="cpu")
    ranks = [ParallelQuantMLP(act, named, TPGroup(r, 2), act_order=act_order, device="cpu") for r in range(2)]
    with torch.no_grad():
        h = whole.hidden(x)
        for r in ranks:
            wanted = h[:, r.down.shard.index] if act_order == "groups" else h[:, r.down.shard.start:r.down.shard.stop]
            assert torch.equal(r.hidden(x), wanted)
        total = ranks[0].partial(x) + ranks[1].partial(x)
    kernels = {r.down.local.kernel.name for r in ranks}
    assert kernels == ({"aten_cpu"} if act_order == "groups" else {"torch_fallback"})  # even groups vs replicated
    verdict = compare(total, golden_linear(act, named["down"], h), tolerance_for(torch.bfloat16))
    assert verdict.ok, verdict.problem
