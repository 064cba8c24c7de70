"""TurboQuant storage: nibble order and dequantization by hand, and every validation error."""

from __future__ import annotations

import math

import pytest
import torch

from quantcore.errors import TensorFormatError
from quantcore.formats.turboquant import TurboQuant, pack_indices, unpack_indices
from quantcore.formats.turboquant.codebook import codebook_tensor


def test_nibble_order_by_hand() -> None:
    idx = torch.tensor([[1, 2, 15, 0], [7, 8, 3, 12]])
    packed = pack_indices(idx)
    assert packed.dtype == torch.uint8
    assert packed.tolist() == [[0x21, 0x0F], [0x87, 0xC3]]  # column 2j low, 2j+1 high
    assert torch.equal(unpack_indices(packed), idx)


def _tiny(fmt: TurboQuant) -> dict[str, torch.Tensor]:
    # d = 2, one row, one group; Π rotates by 90°: Π = [[0, -1], [1, 0]].
    return {
        "indices": pack_indices(torch.tensor([[15, 0]])),
        "norms": torch.tensor([[2.0]], dtype=torch.float16),
        "rotation": torch.tensor([[[0.0, -1.0], [1.0, 0.0]]]),
        "codebook": codebook_tensor(4),
    }


def test_tiny_checkpoint_dequantizes_by_hand() -> None:
    fmt = TurboQuant(group_size=2)
    t = _tiny(fmt)
    c = t["codebook"].double()
    # ŵ = ‖w‖/√d · c[idx] @ Π = 2/√2 · [c15, c0] @ [[0, -1], [1, 0]] = √2 · [c0, −c15]
    expected = math.sqrt(2) * torch.tensor([[c[0].item(), -c[15].item()]], dtype=torch.float64)
    assert torch.allclose(fmt.dequantize(t), expected, rtol=0, atol=1e-12)


def test_residual_pass_adds_by_hand() -> None:
    fmt = TurboQuant(group_size=2, residual=True)
    t = _tiny(fmt)
    t |= {"residual_indices": pack_indices(torch.tensor([[8, 8]])),
          "residual_norms": torch.tensor([[0.5]], dtype=torch.float16),
          "residual_rotation": torch.eye(2).unsqueeze(0)}
    c8 = t["codebook"][8].double().item()
    one = TurboQuant(group_size=2).dequantize({k: v for k, v in t.items() if not k.startswith("residual_")})
    assert torch.allclose(fmt.dequantize(t), one + 0.5 / math.sqrt(2) * c8, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.pop("norms"), "missing tensor"),
        (lambda t: t.update(extra=torch.zeros(1)), "unexpected tensor"),
        (lambda t: t.update(indices=t["indices"].to(torch.int32)), "indices: expected dtype uint8"),
        (lambda t: t.update(norms=t["norms"].float()), "norms: expected dtype float16"),
        (lambda t: t.update(norms=t["norms"][:, :1]), "norms: expected shape"),
        (lambda t: t.update(rotation=t["rotation"] * 2), "expected orthogonal"),
        (lambda t: t.update(rotation=t["rotation"].repeat(2, 1, 1)), "rotation: expected shape"),
        (lambda t: t.update(codebook=t["codebook"][:8]), "codebook: expected shape"),
        (lambda t: t.update(norms=torch.full_like(t["norms"], float("nan"))), "norms: contains NaN"),
        (lambda t: t.update(bias=torch.zeros(3)), "bias: expected shape"),
        (lambda t: t.update(residual_indices=t["indices"]), "residual tensors given"),
    ],
)
def test_validation_names_the_tensor(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    fmt = TurboQuant(group_size=64)
    t = fmt.quantize(torch.randn(8, 128), generator=torch.Generator().manual_seed(0))
    mutate(t)
    with pytest.raises(TensorFormatError, match=message):
        fmt.validate(t)


def test_k_must_be_a_multiple_of_the_group() -> None:
    fmt = TurboQuant(group_size=64)
    t = fmt.quantize(torch.randn(8, 128))
    t["indices"] = t["indices"][:, :48]
    with pytest.raises(TensorFormatError, match="not a multiple of group_size"):
        fmt.validate(t)


def test_indices_beyond_a_small_codebook_are_refused() -> None:
    fmt = TurboQuant(bits=2, group_size=64)
    t = fmt.quantize(torch.randn(4, 64))
    t["indices"][0, 0] = 0x40  # high nibble 4 ≥ 2^2
    with pytest.raises(TensorFormatError, match="below 4"):
        fmt.validate(t)


@pytest.mark.parametrize("params", [{"bits": 5}, {"group_size": 3}, {"group_size": 0}, {"norm_dtype": torch.int8}])
def test_bad_parameters(params: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(TensorFormatError):
        TurboQuant(**params)


def test_slug_and_params_round_trip() -> None:
    fmt = TurboQuant(bits=3, group_size=64, residual=True, rotation_per_group=True, norm_dtype=torch.float32)
    assert fmt.slug == "tq3-g64-res-pg-nfp32"
    assert TurboQuant.from_params(**{k: str(v) for k, v in fmt.params().items()}) == fmt
