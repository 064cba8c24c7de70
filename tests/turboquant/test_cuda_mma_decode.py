"""The ``mma.sync`` decode path of ``turboquant_triton`` (``decode_mma.py``) on an sm_90 GPU:
against the float golden in both 16-bit dtypes, one and two passes, 1 to 8 rows, N off the
64-row tile; the same bits call after call and replayed from a CUDA graph; taken by an
ordinary call where the card's own table names it; more rows than the MMA's N refused."""

from __future__ import annotations

import functools

import pytest
import torch

from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.linear import linear_reference

from .cuda_layers import DTYPES, prepared_on_cuda, quantized_layer

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
pytestmark = pytest.mark.skipif(not SM90, reason="the mma.sync decode kernel is compiled for sm_90 (an H100 or H200)")


@functools.lru_cache(maxsize=4)
def _layer(k: int, n: int, passes: int) -> tuple[TurboQuant, dict[str, torch.Tensor], torch.Tensor]:
    fmt = TurboQuant(group_size=128, residual=passes == 2)
    t = quantized_layer(fmt, n, k, seed=k + 3 * n + passes)
    return fmt, t, fmt.dequantize(t)


def _call(prep, x, dtype, config=None):  # type: ignore[no-untyped-def]
    from quantcore.backends.turboquant_triton.fused import fused_linear

    return fused_linear(x, prep.passes, prep.codebook, group_size=128, partial=None, bias=prep.bias,
                        out_dtype=dtype, path="mma_decode", config=config)


def _configs():  # type: ignore[no-untyped-def]
    from quantcore.backends.turboquant_triton.configs import MmaDecodeConfig

    return [MmaDecodeConfig(split=s, tiles=t, copies=c, wide=w, xvec=v)
            for s, t, c, w, v in ((1, 1, 16, False, False), (3, 2, 32, False, False), (8, 2, 32, False, False),
                                  (3, 2, 32, True, False))]


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("k", "n"), [(1024, 1000), (1408, 256)])
def test_cuda_mma_decode_matches_golden(k: int, n: int, dtype: torch.dtype, m: int, passes: int) -> None:
    fmt, t, w_hat = _layer(k, n, passes)
    prep = prepared_on_cuda(fmt, t, dtype)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k)).to(dtype)
    ref = linear_reference(x, w_hat, t["bias"])
    for cfg in _configs():
        y = _call(prep, x.cuda(), dtype, cfg)
        result = compare(y.cpu(), ref, tolerance_for(dtype))
        assert result.ok, f"{cfg}: {result.problem}"
        assert torch.equal(y, _call(prep, x.cuda(), dtype, cfg)), f"{cfg}: not the same bits on a second call"


def test_cuda_mma_decode_replays_from_a_graph_bit_for_bit() -> None:
    fmt, t, _ = _layer(2048, 512, 2)
    prep = prepared_on_cuda(fmt, t, torch.bfloat16)
    x = torch.randn(4, 2048, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).cuda()
    cfg = _configs()[2]
    _call(prep, x, torch.bfloat16, cfg)  # compiled before the recording
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _call(prep, x, torch.bfloat16, cfg)
    x.copy_(torch.randn(4, 2048, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16))
    graph.replay()
    assert torch.equal(captured, _call(prep, x, torch.bfloat16, cfg))


def test_cuda_an_ordinary_call_takes_the_path_where_the_cards_table_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.backends.turboquant_triton import configs, fused
    from quantcore.probe.card import card_key

    fmt, t, w_hat = _layer(1024, 1000, 2)
    prep = prepared_on_cuda(fmt, t, torch.bfloat16)
    card = card_key(0)
    entry = ("mma_decode", 1024, 1000, 128, 2, "bfloat16", configs.MMA_DECODE_ROWS)
    shipped = configs.tables()
    monkeypatch.setattr(configs, "tables", lambda: {**shipped, card: {**shipped.get(card, {}), entry: _configs()[1]}})
    x = torch.randn(5, 1024, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    y, bucket = fused._chosen(x.cuda(), prep.passes, prep.codebook, 128, None, prep.bias, torch.bfloat16, None, None)
    assert type(bucket).__name__ == "_MmaDecode"
    result = compare(y.cpu(), linear_reference(x, w_hat, t["bias"]), tolerance_for(torch.bfloat16))
    assert result.ok, result.problem
    partial = torch.zeros(5, 1000, device="cuda")  # a running partial never takes it
    _, other = fused._chosen(x.cuda(), prep.passes[:1], prep.codebook, 128, partial, None, torch.float32, None, None)
    assert type(other).__name__ != "_MmaDecode"


def test_cuda_mma_decode_refuses_more_rows_than_its_mma() -> None:
    fmt, t, _ = _layer(1024, 1000, 1)
    prep = prepared_on_cuda(fmt, t, torch.bfloat16)
    with pytest.raises(ValueError, match="1 to 8 rows"):
        _call(prep, torch.randn(9, 1024, device="cuda").to(torch.bfloat16), torch.bfloat16)
