"""compressed-tensors pack-quantized ↔ GPTQ v2: bit-exact both ways.

The pack-quantized side is produced by the ``compressed-tensors`` package (its
``calculate_qparams``, ``quantize``, ``pack_to_int32``), its dequantization is the
package's ``dequantize``; the GPTQ side is quantcore's. Plus golden vectors for a tiny
shape, written out by hand from the layout (docs/checkpoints.md)."""

from __future__ import annotations

import itertools

import pytest
import torch

from quantcore.errors import TensorFormatError
from quantcore.formats.compressed_tensors import CompressedTensors
from quantcore.formats.gptq import GPTQ
from quantcore.transforms.compressed_gptq import CompressedToGPTQ

ct = pytest.importorskip("compressed_tensors", reason="pip install compressed-tensors")

from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

OUT, IN = 64, 256


def _package_layer(bits: int, group_size: int, sym: bool, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(OUT, IN, generator=gen) * 0.05).to(dtype)
    args = QuantizationArgs(num_bits=bits, symmetric=sym, strategy="group" if group_size > 0 else "channel",
                            group_size=group_size if group_size > 0 else None)
    groups = IN // group_size if group_size > 0 else 1
    by_group = weight.reshape(OUT, groups, -1)
    scale, zero = calculate_qparams(by_group.amin(-1), by_group.amax(-1), args)
    q = quantize(weight, scale, zero, args, dtype=torch.int8)
    tensors = {"weight_packed": pack_to_int32(q, bits), "weight_scale": scale, "weight_shape": torch.tensor([OUT, IN])}
    if not sym:
        tensors["weight_zero_point"] = pack_to_int32(zero.to(torch.int8), bits, packed_dim=0)
    return tensors, dequantize(q, scale, zero if not sym else None, args)


@pytest.mark.parametrize("bits, group_size, sym, dtype", list(itertools.product(
    (2, 4, 8), (32, 128, -1), (True, False), (torch.bfloat16, torch.float16))))
def test_the_packages_layers_dequantize_alike_and_round_trip(bits, group_size, sym, dtype) -> None:
    tensors, reference = _package_layer(bits, group_size, sym, dtype, seed=bits * 7 + group_size)
    fmt = CompressedTensors(bits=bits, group_size=group_size, sym=sym)
    assert torch.equal(fmt.dequantize(tensors).to(dtype), reference)
    transform = CompressedToGPTQ(fmt)
    gptq = transform.apply(tensors)
    assert transform.target == GPTQ(bits=bits, group_size=group_size, sym=sym, checkpoint_format="v2")
    assert torch.equal(transform.target.dequantize(gptq).to(dtype), reference)
    back = transform.invert(gptq)
    assert back.keys() == tensors.keys()
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype or name == "weight_shape", name
        assert torch.equal(back[name].to(t.dtype), t), name


@pytest.mark.parametrize("bits, sym", [(4, True), (4, False), (8, False)])
def test_act_order_round_trips_from_the_gptq_side(bits, sym) -> None:
    gen = torch.Generator().manual_seed(5)
    gptq_fmt = GPTQ(bits=bits, group_size=32, sym=sym, desc_act=True)
    gptq = gptq_fmt.quantize(torch.randn(OUT, IN, generator=gen) * 0.05, generator=gen)
    fmt = CompressedTensors(bits=bits, group_size=32, sym=sym, act_order=True)
    transform = CompressedToGPTQ(fmt)
    packed = transform.invert(gptq)
    assert torch.equal(packed["weight_g_idx"], gptq["g_idx"])
    assert torch.equal(fmt.dequantize(packed), gptq_fmt.dequantize(gptq))
    again = transform.apply(packed)
    for name in ("qweight", "qzeros", "scales", "g_idx"):
        assert torch.equal(again[name], gptq[name]), name


def test_golden_vectors_for_a_tiny_layer() -> None:
    """O = I = 8, 4 bits, one group: stored codes u[o, i] = (o + 2i) mod 16, zero
    points z[o] = o + 4. Pack-quantized row o is the lane Σᵢ u[o, i]·16ⁱ; GPTQ column o
    is the same lane; both store the zero points as the lane Σₒ z[o]·16ᵒ."""
    u = [[(o + 2 * i) % 16 for i in range(8)] for o in range(8)]
    z = [o + 4 for o in range(8)]

    def lane(fields: list[int]) -> int:
        value = sum(f << (4 * j) for j, f in enumerate(fields))
        return value - (1 << 32) if value >= 1 << 31 else value

    scale = torch.tensor([[0.5 + o / 8] for o in range(8)], dtype=torch.float16)
    tensors = {
        "weight_packed": torch.tensor([[lane(u[o])] for o in range(8)], dtype=torch.int32),
        "weight_scale": scale,
        "weight_zero_point": torch.tensor([[lane(z)]], dtype=torch.int32),
        "weight_shape": torch.tensor([8, 8]),
    }
    fmt = CompressedTensors(bits=4, group_size=-1, sym=False)
    expected = torch.tensor([[(u[o][i] - z[o]) * float(scale[o, 0]) for i in range(8)] for o in range(8)],
                            dtype=torch.float64)
    assert torch.equal(fmt.dequantize(tensors), expected)
    gptq = CompressedToGPTQ(fmt).apply(tensors)
    assert gptq["qweight"].tolist() == [[lane(u[o]) for o in range(8)]]
    assert gptq["qzeros"].tolist() == [[lane(z)]]
    assert torch.equal(gptq["scales"], scale.T) and gptq["g_idx"].tolist() == [0] * 8


def test_bad_layers_are_refused_naming_the_tensor() -> None:
    tensors, _ = _package_layer(4, 32, False, torch.bfloat16, seed=0)
    fmt = CompressedTensors(bits=4, group_size=32, sym=False)
    with pytest.raises(TensorFormatError, match=r"missing tensor.*weight_zero_point"):
        fmt.validate({k: v for k, v in tensors.items() if k != "weight_zero_point"})
    with pytest.raises(TensorFormatError, match="weight_scale: expected shape"):
        CompressedTensors(bits=4, group_size=64, sym=False).validate(tensors)
    with pytest.raises(TensorFormatError, match="weight_shape: in_features=12 is not a multiple of 8"):
        fmt.validate({**tensors, "weight_shape": torch.tensor([OUT, 12])})
    sym = CompressedToGPTQ(CompressedTensors(bits=4, group_size=32, sym=True))
    asym_gptq = CompressedToGPTQ(fmt).apply(tensors)
    with pytest.raises(TensorFormatError, match=r"symmetric .* has every zero point 8"):
        sym.invert(asym_gptq)
    with pytest.raises(TensorFormatError, match="compressed_tensors bits"):
        CompressedTensors(bits=3)
