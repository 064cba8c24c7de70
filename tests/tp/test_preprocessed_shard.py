"""TensorRT-LLM's preprocessed layout cut in place: on every arch and weight type the cut
bytes are exactly what the preprocessor makes of the logical shard, and the Triton MoE
kernel runs the cut prepared state to the same result as the whole."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from quantcore.backends.trtllm_moe.preprocess import CutlassMixedGemmLayout, QuantType
from quantcore.backends.trtllm_moe.preprocess.shard import layout_unit, shard_preprocessed
from quantcore.errors import ShardError
from quantcore.formats.trtllm_moe import TRTLLMMoE

LAYOUTS = [CutlassMixedGemmLayout(qt, arch, force)
           for qt, arch, force in itertools.product(QuantType, (70, 75, 80, 86, 89, 90), (False, True))
           if not (force and arch != 90)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"{lay.quant_type.value}-sm{lay.arch}{'-force' if lay.force_interleave else ''}")
def test_cut_bytes_are_the_preprocessed_logical_shard(layout):
    qt = layout.quant_type
    k, n = 512, 512
    nb = n * qt.bits // 8
    gen = torch.Generator().manual_seed(layout.arch)
    logical = torch.randint(-128, 128, (1, k, nb), generator=gen, dtype=torch.int16).to(torch.int8)
    processed = layout.apply(logical)
    for dim, world in itertools.product("KN", (1, 2, 4)):
        for rank in range(world):
            cut = shard_preprocessed(layout, processed, dim=dim, rank=rank, world=world)
            part = logical.narrow(1, rank * k // world, k // world) if dim == "K" else logical.narrow(2, rank * nb // world, nb // world)
            assert torch.equal(cut, layout.apply(part.contiguous())), (dim, world, rank)
    # 2-D (one expert) goes through the same way
    assert torch.equal(shard_preprocessed(layout, processed[0], dim="N", rank=1, world=2),
                       layout.apply(logical[0, :, nb // 2:].contiguous()))


def test_a_cut_inside_a_tile_is_refused_with_the_worlds_that_work():
    layout = CutlassMixedGemmLayout(QuantType.W8_A16, 80)
    assert layout_unit(layout.details, "K") == (64, "32-element vectors of the transpose, row-permutation blocks of 16, column tiles of 64 rows")
    assert layout_unit(layout.details, "N")[0] == 32
    processed = layout.apply(torch.zeros(256, 256, dtype=torch.int8))
    with pytest.raises(ShardError, match=r"K = 256 over world=8: a part of 32 is not a multiple of 64 .* world ∈ \{1, 2, 4\}"):
        shard_preprocessed(layout, processed, dim="K", rank=0, world=8)
    with pytest.raises(ShardError, match=r"whole groups of 128 rows"):
        shard_preprocessed(layout, processed, dim="K", rank=0, world=4, group_size=128)
    with pytest.raises(ShardError, match=r"rank: expected an int in \[0, 2\)"):
        shard_preprocessed(layout, processed, dim="N", rank=2, world=2)
    with pytest.raises(ShardError, match=r"expected int8 \[E, K, N·bits/8\]"):
        shard_preprocessed(layout, processed.float(), dim="N", rank=0, world=2)


needs_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                  reason="Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)")


@needs_triton
@pytest.mark.parametrize("dim", ["K", "N", "E"])
def test_triton_prepared_shards_equal_prepare_of_the_shard_and_run(dim):
    pytest.importorskip("triton")
    from quantcore.backends.trtllm_moe import TritonMoE

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    fmt = TRTLLMMoE(group_size=64, sym=False, scale_dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(4)
    tensors = {k: v.to(device) for k, v in fmt.quantize(torch.randn(4, 256, 128, generator=gen) * 0.05).items()}
    kernel = TritonMoE(fmt, torch.device(device))
    whole = kernel.prepare(tensors, dtype=torch.bfloat16)
    x = torch.randn(5, 256, generator=gen).to(device, torch.bfloat16)
    ids = torch.randint(0, 4, (5, 2), generator=gen).to(device)
    weights = torch.softmax(torch.randn(5, 2, generator=gen), -1).to(device)
    outs = []
    for rank in range(2):
        cut = kernel.shard_prepared(whole, dim=dim, rank=rank, world=2)
        shard = fmt.shard(tensors, dim=dim, rank=rank, world=2)
        again = TritonMoE(shard.format, torch.device(device)).prepare(shard.tensors, dtype=torch.bfloat16)
        for field in ("layout", "scales", "zeros"):
            assert torch.equal(getattr(cut, field), getattr(again, field)), field
        if dim == "E":
            mine = (ids >= shard.start) & (ids < shard.stop)
            outs.append(kernel(x, torch.where(mine, ids - shard.start, 0), cut, topk_weights=weights * mine).float())
        else:
            xs = x[:, shard.start:shard.stop].contiguous() if dim == "K" else x
            outs.append(kernel(xs, ids, cut, topk_weights=weights).float())
    combined = torch.cat(outs, -1) if dim == "N" else outs[0] + outs[1]
    reference = kernel(x, ids, whole, topk_weights=weights).float()
    assert (combined - reference).norm() / reference.norm() < 2 * 2.0**-8
