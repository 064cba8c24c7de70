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
    fused_shard_tensors,
)
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.conformance.tp.processes import golden_linear, mlp_layers
from quantcore.errors import FusionError, QuantCoreWarning, ShardError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.formats.turboquant import TurboQuant

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


# --- gate and up as one launch per rank -------------------------------------------------------

FUSABLE = {
    "gptq-asym": GPTQ(bits=4, group_size=64, sym=False),
    "gptq-sym": GPTQ(bits=4, group_size=64, sym=True),
    "gptq-act-order": GPTQ(bits=4, group_size=64, sym=False, desc_act=True),
    "awq": AWQ(bits=4, group_size=64),
    "turboquant": TurboQuant(bits=4, group_size=32),
}


def _roles(fmt, **kw):
    return {k.rsplit(".", 1)[1].removesuffix("_proj"): v for k, v in mlp_layers(fmt, 128, 256, **kw).items()}


# every format that shards and concatenates, and act-order's other row cut ("groups")
@pytest.mark.parametrize(("name", "act_order"), [*((n, "replicate") for n in FUSABLE), ("gptq-act-order", "groups")])
def test_fused_gate_up_equals_the_two_layers_bit_for_bit_on_every_rank(name, act_order):
    fmt = FUSABLE[name]
    named = _roles(fmt)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    for world in (1, 2, 4):
        for rank in range(world):
            fused = ParallelQuantMLP(fmt, named, TPGroup(rank, world), act_order=act_order, device="cpu")
            apart = ParallelQuantMLP(fmt, named, TPGroup(rank, world), act_order=act_order, device="cpu",
                                     fuse_gate_up=False)
            assert fused.unfused_why == "" and fused.gate is None and fused.up is None
            assert apart.unfused_why == "fuse_gate_up=False" and apart.gate_up is None
            # rank r's fused layer is exactly its shard of gate then its shard of up
            want = {role: fmt.shard(named[role], dim="N", rank=rank, world=world, index=fused.down.shard.index)
                    for role in ("gate", "up")}
            for role, shard in fused.gate_up.shards.items():
                assert shard.tensors.keys() == want[role].tensors.keys()
                assert all(torch.equal(t, want[role].tensors[k]) for k, t in shard.tensors.items())
            assert fused.gate_up.local.out_features == 2 * want["up"].size
            with torch.no_grad():
                got, ref = fused.columns(x), apart.columns(x)
                assert got.keys() == ref.keys() == {"gate", "up"}
                assert all(torch.equal(got[k], ref[k]) for k in ref), (world, rank)
                assert torch.equal(fused.partial(x), apart.partial(x)), (world, rank)
            assert fused.kernels() == apart.kernels()


def test_fused_ranks_gathered_are_the_whole_layers_and_the_block_meets_the_golden():
    named = _roles(FMT)
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    ranks = [ParallelQuantMLP(FMT, named, TPGroup(r, 2), device="cpu") for r in range(2)]
    with torch.no_grad():
        cols = [r.columns(x) for r in ranks]
        total = ranks[0].partial(x) + ranks[1].partial(x)
    tol = tolerance_for(torch.bfloat16)
    for role in ("gate", "up"):
        verdict = compare(torch.cat([c[role] for c in cols], dim=-1), golden_linear(FMT, named[role], x), tol)
        assert verdict.ok, (role, verdict.problem)
    h = torch.cat([torch.nn.functional.silu(c["gate"]) * c["up"] for c in cols], dim=-1)
    verdict = compare(total, golden_linear(FMT, named["down"], h), tol)
    assert verdict.ok, verdict.problem


def test_act_order_layers_with_different_g_idx_fall_back_to_two_layers_with_the_reason():
    act = FUSABLE["gptq-act-order"]
    named = _roles(act, shared_order=False)  # gate and up quantized in different column orders
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with pytest.warns(QuantCoreWarning, match=r"gate and up run as two layers: .*g_idx"):
        block = ParallelQuantMLP(act, named, TPGroup(1, 2), act_order="groups", device="cpu")
    assert "g_idx" in block.unfused_why and block.gate_up is None
    assert block.gate is not None and block.up is not None
    apart = ParallelQuantMLP(act, named, TPGroup(1, 2), act_order="groups", device="cpu", fuse_gate_up=False)
    with torch.no_grad():
        assert torch.equal(block.partial(x), apart.partial(x))


def test_a_block_without_gate_has_nothing_to_fuse():
    named = _roles(FMT)
    del named["gate"]
    block = ParallelQuantMLP(FMT, named, TPGroup(0, 2), activation="relu", device="cpu")
    assert block.unfused_why == "the block has no gate" and block.gate_up is None and not block.gated
    assert block.kernels() == {"up": "aten_cpu", "down": "aten_cpu"}
    assert [s.dim for s in block.shards()] == ["N", "K"]


def test_fused_shard_tensors_names_what_cannot_be_concatenated():
    named = _roles(FMT)
    gate = FMT.shard(named["gate"], dim="N", rank=0, world=2)
    other = GPTQ(bits=4, group_size=128, sym=False)
    up = other.shard(mlp_layers(other, 128, 256)["mlp.up_proj"], dim="N", rank=0, world=2)
    with pytest.raises(FusionError, match="gate shard is gptq4-g64-asym, up shard is gptq4-g128-asym"):
        fused_shard_tensors({"gate": gate, "up": up})
    fmt, tensors = fused_shard_tensors({"gate": gate, "up": FMT.shard(named["up"], dim="N", rank=0, world=2)})
    assert fmt == FMT and FMT.validate(tensors)["N"] == 256
    assert torch.equal(tensors["bias"][:128], torch.zeros(128, dtype=torch.float16))  # gate had none: zeros
