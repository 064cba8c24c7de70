"""Every linear format's concatenation along N, at the format level: the inverse of a
column cut. Layers laid end to end dequantize to the parts' weights stacked, bit for
bit; a column cut of the result gives the parts back, bit for bit; and parts that
differ in anything but their outputs are refused naming the parts and what differs."""

from __future__ import annotations

import pytest
import torch

from quantcore.errors import FusionError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.formats.turboquant import TurboQuant

FORMATS = [
    GPTQ(bits=4, group_size=128, sym=True),
    GPTQ(bits=4, group_size=64, sym=False, desc_act=True),
    GPTQ(bits=4, group_size=32, sym=False, desc_act=True, static_groups=True),
    GPTQ(bits=4, group_size=-1, sym=False, checkpoint_format="v1"),
    GPTQ(bits=3, group_size=64, sym=False, checkpoint_format="v1"),
    GPTQ(bits=2, group_size=64, pack_dtype=torch.int8),
    GPTQ(bits=8, group_size=64, sym=False, pack_dtype=torch.int64, desc_act=True),
    AWQ(group_size=64),
    AWQ(group_size=-1, zero_point=False),
    TurboQuant(group_size=64),
    TurboQuant(group_size=64, residual=True, rotation_per_group=True),
    TurboQuant(bits=3, group_size=32, norm_dtype=torch.float32),
]
K = 256


def _parts(fmt, sizes, *, seed: int = 3, shared_draw: bool = True, bias: bool = True):
    """Layers of ``sizes`` outputs on one input; with ``shared_draw`` the quantizer's
    random choices (act-order's column order, TurboQuant's rotations) are the same draw
    for every part, as ``quantize_(..., fuse=True)`` makes them."""
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for i, n in enumerate(sizes):
        draw = torch.Generator().manual_seed(seed if shared_draw else seed + i + 1)
        tensors = dict(fmt.quantize(torch.randn(n, K, generator=gen) * 0.05, generator=draw))
        if bias:
            tensors["bias"] = torch.randn(n, generator=gen).to(torch.float16)
        parts.append(tensors)
    return parts


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.slug)
def test_concat_dequantizes_to_the_parts_stacked_and_a_column_cut_gives_them_back(fmt) -> None:
    unequal = _parts(fmt, (128, 64, 64))
    fused = fmt.concat(unequal, names=("q_proj", "k_proj", "v_proj"))
    assert fmt.validate(fused) == {"K": K, "N": 256}
    want = torch.cat([fmt.dequantize(p) for p in unequal])
    assert torch.equal(fmt.dequantize(fused), want)
    assert torch.equal(fused["bias"], torch.cat([p["bias"] for p in unequal]))
    equal = _parts(fmt, (96, 96), seed=5)
    both = fmt.concat(equal)
    for rank, part in enumerate(equal):
        shard = fmt.shard(both, dim="N", rank=rank, world=2)
        assert shard.format == fmt and shard.tensors.keys() == part.keys()
        for name, t in part.items():
            assert shard.tensors[name].dtype == t.dtype and torch.equal(shard.tensors[name], t), (rank, name)


def test_concat_owns_its_memory() -> None:
    fmt = TurboQuant(group_size=64)
    parts = _parts(fmt, (64, 64))
    fused = fmt.concat(parts)
    for name, t in fused.items():
        assert all(t.untyped_storage().data_ptr() != p[name].untyped_storage().data_ptr() for p in parts), name


def _refusal(fmt, parts, match: str) -> None:
    with pytest.raises(FusionError, match=match):
        fmt.concat(parts, names=("q_proj", "k_proj"))


def test_parts_that_differ_beyond_their_outputs_are_refused_naming_them() -> None:
    act = GPTQ(bits=4, group_size=64, sym=False, desc_act=True)
    _refusal(act, _parts(act, (64, 64), shared_draw=False),
             r"gptq4-g64-asym-act concat of q_proj, k_proj: g_idx is not cut along N.*k_proj's differs from q_proj's")
    tq = TurboQuant(group_size=64)
    _refusal(tq, _parts(tq, (64, 64), shared_draw=False), r"rotation is not cut along N.*k_proj's differs")
    gptq = GPTQ(bits=4, group_size=64)
    wide = dict(gptq.quantize(torch.randn(64, 2 * K) * 0.05))
    _refusal(gptq, [_parts(gptq, (64,), bias=False)[0], wide], r"in_features differ \(q_proj K = 256, k_proj K = 512\)")
    with_bias, without = _parts(gptq, (64,))[0], _parts(gptq, (64,), bias=False)[0]
    _refusal(gptq, [with_bias, without], r"q_proj holds .*'bias'.*k_proj holds .*differ in bias")
    half = dict(with_bias, scales=with_bias["scales"].to(torch.bfloat16))
    _refusal(gptq, [with_bias, half], r"scales: q_proj has torch.float16 on cpu, k_proj has torch.bfloat16 on cpu")
    other = GPTQ(bits=4, group_size=128)
    _refusal(gptq, [with_bias, dict(other.quantize(torch.randn(64, K) * 0.05))], r"k_proj: .*scales")


def test_formats_without_a_concatenation_say_so() -> None:
    for fmt in (SVDQuantAct(fp4=True), TRTLLMMoE(group_size=128)):
        with pytest.raises(FusionError, match=f"the {fmt.name} format defines no concatenation along N"):
            fmt.concat([{}, {}])


def test_a_bad_request_is_refused() -> None:
    fmt = GPTQ(bits=4, group_size=64)
    parts = _parts(fmt, (64, 64))
    with pytest.raises(FusionError, match=r"expected one or more parts and a name for each, got 2 part\(s\) and 1"):
        fmt.concat(parts, names=("q_proj",))
    with pytest.raises(FusionError, match=r"expected one or more parts"):
        fmt.concat([])
