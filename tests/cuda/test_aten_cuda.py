"""aten_cuda: its byte order by hand and its refusals on CPU; on a CUDA machine the
conformance matrix runs it (``pytest conformance --qc-device cuda``)."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.aten_cuda.kernel import AtenCudaAWQ, AtenCudaGPTQ
from quantcore.backends.aten_cuda.transform import inner_k_tiles, tinygemm_bytes
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.probe import probe
from quantcore.problem import Problem


def test_tinygemm_bytes_even_input_high() -> None:
    """Measured on the H100: the even input goes in the high nibble."""
    codes = torch.tensor([[1, 2, 3, 4], [15, 0, 7, 8]])
    assert tinygemm_bytes(codes).tolist() == [[0x12, 0x34], [0xF0, 0x78]]


def test_inner_k_tiles() -> None:
    assert [inner_k_tiles(k) for k in (4096, 96, 64, 48)] == [8, 2, 4, None]


def test_refused_on_cpu() -> None:
    assert AtenCudaGPTQ.check_device(probe("cpu")) == "runs on cuda, not cpu"


@pytest.mark.parametrize(
    ("cls", "fmt", "dtype", "n", "reason"),
    [
        (AtenCudaGPTQ, GPTQ(bits=4), torch.float16, 256, "tinygemm takes bf16"),
        (AtenCudaGPTQ, GPTQ(bits=3), torch.bfloat16, 256, "4-bit codes only"),
        (AtenCudaGPTQ, GPTQ(bits=4, group_size=16), torch.bfloat16, 256, "group_size=16"),
        (AtenCudaGPTQ, GPTQ(bits=4), torch.bfloat16, 20, "N=20"),
        (AtenCudaAWQ, AWQ(), torch.float32, 256, "tinygemm takes bf16"),
        (AtenCudaAWQ, GPTQ(), torch.bfloat16, 256, "not AWQ"),
    ],
)
def test_supports_refusals(cls, fmt, dtype, n: int, reason: str) -> None:
    ok, why = cls.supports(Problem.linear(fmt, M=1, K=256, N=n, dtype=dtype))
    assert not ok and reason in why


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_awq_on_gpu_matches_golden() -> None:
    from quantcore.conformance.tolerance import compare, tolerance_for
    from quantcore.ops.linear import linear_reference

    fmt = AWQ(group_size=128)
    t = fmt.quantize(torch.randn(256, 512) * 0.05)
    x = torch.randn(4, 512).bfloat16()
    k = AtenCudaAWQ(fmt, "cuda")
    y = k(x.cuda(), k.prepare({n: v.cuda() for n, v in t.items()}, dtype=torch.bfloat16))
    assert compare(y, linear_reference(x, fmt.dequantize(t)), tolerance_for(torch.bfloat16)).ok
