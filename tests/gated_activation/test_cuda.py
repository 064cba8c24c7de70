"""What only a CUDA GPU can show of the gated activation: the compiled kernel against
torch's own CUDA ops (``act(g) * u``) within one unit in the last place of the dtype, on
fresh random inputs; one kernel launch a call; and a CUDA-graph capture whose replays give
the eager call's bits.

Run with ``--qc-device cuda`` (otherwise the quantcore pytest plugin turns Triton's
interpreter on for the CPU): ``pytest tests/gated_activation --qc-device cuda``.
"""

from __future__ import annotations

import pytest
import torch

from tests.compiled_cuda import skip_unless_compiled_cuda

skip_unless_compiled_cuda()
pytest.importorskip("triton")

from quantcore.kernels.gated_activation import (  # noqa: E402  (after the module-level skips)
    ACTIVATIONS,
    KERNEL_ACTIVATIONS,
    KERNEL_DTYPES,
    gated_activation,
    why_torch,
)

DEV = torch.device("cuda")
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _h(*lead: int, inter: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Gates spread to ±10 or so (the activations' tails), ups around 1."""
    gen = torch.Generator().manual_seed(seed)
    gate, up = torch.randn(*lead, inter, generator=gen) * 3, torch.randn(*lead, inter, generator=gen)
    return torch.cat([gate, up], -1).to(dtype).to(DEV)


def _torch_route(h: torch.Tensor, activation: str) -> torch.Tensor:
    inter = h.shape[-1] // 2
    return ACTIVATIONS[activation](h[..., :inter]) * h[..., inter:]


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many values of the dtype lie between ``a`` and ``b`` (0: the same bits, or ±0)."""
    def ordered(x: torch.Tensor) -> torch.Tensor:
        bits = x.view(_BITS[x.dtype]).long()
        magnitude = bits & ((1 << (8 * x.element_size() - 1)) - 1)
        return torch.where(bits < 0, -magnitude, magnitude)
    return (ordered(a) - ordered(b)).abs()


def test_the_kernel_runs_on_this_device() -> None:
    assert why_torch(DEV) == ""


@pytest.mark.parametrize("inter", [37, 1100, 7168])
@pytest.mark.parametrize("m", [1, 3, 64])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_the_kernel_is_within_one_ulp_of_torchs_cuda_ops(activation: str, dtype: torch.dtype, m: int,
                                                         inter: int) -> None:
    h = _h(m, inter=inter, dtype=dtype, seed=1000 * m + inter)
    got, want = gated_activation(h, activation), _torch_route(h, activation)
    assert got.shape == want.shape == (m, inter) and got.dtype == dtype
    assert torch.equal(got.isnan(), want.isnan())
    apart = _ulps_apart(got, want)
    if activation not in KERNEL_ACTIVATIONS:
        assert int(apart.max()) == 0  # torch's own ops run here (op.py says why): the same bits
        return
    if activation == "relu":
        assert int(apart.max()) == 0  # no exp or erf: the same exact operations, the same bits
        return
    # The kernel's exp and erf are libdevice's expf and erff, the CUDA math library torch's
    # kernels call, and the rest of the arithmetic is the contract's (op.py); one unit is
    # what a different float32 exp/erf last bit can move a rounded dtype value by.
    worst = int(apart.argmax())
    assert int(apart.max()) <= 1, (f"{int(apart.max())} ulps at {divmod(worst, inter)}: "
                                   f"{got.flatten()[worst].item()} vs {want.flatten()[worst].item()}")


def test_leading_dims_and_rows_of_a_larger_buffer() -> None:
    buf = _h(9, inter=700, dtype=torch.bfloat16, seed=5)
    rows = buf[2:7, 6:1206]  # rows 1400 elements apart, I = 600
    assert int(_ulps_apart(gated_activation(rows, "silu"), _torch_route(rows, "silu")).max()) <= 1
    lead = _h(2, 3, inter=96, dtype=torch.float16, seed=6)
    got = gated_activation(lead, "gelu")
    assert got.shape == (2, 3, 96)
    assert torch.equal(got.view(-1, 96), gated_activation(lead.view(-1, 192), "gelu"))


def test_a_call_is_one_kernel_launch() -> None:
    from torch.profiler import ProfilerActivity, profile

    h = _h(16, inter=7168, dtype=torch.bfloat16, seed=7)
    gated_activation(h, "silu")  # compiled outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        gated_activation(h, "silu")
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1 and "gated_activation_kernel" in kernels[0], kernels


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_cuda_graph_replays_give_the_eager_bits(activation: str, dtype: torch.dtype) -> None:
    static = _h(8, inter=1100, dtype=dtype, seed=11)
    gated_activation(static, activation)  # compiles and binds outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # a warm-up on the capture's side stream, as torch.cuda.graphs asks
        gated_activation(static, activation)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gated_activation(static, activation)
    for seed in (12, 13):
        fresh = _h(8, inter=1100, dtype=dtype, seed=seed)
        static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        eager = gated_activation(fresh, activation)
        assert torch.equal(out.view(_BITS[dtype]), eager.view(_BITS[dtype])), f"replay with seed {seed}"


def test_torch_compile_sees_torchs_ops_not_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``torch.compile`` the op is torch's ops (inductor fuses them itself): the
    compiled call traces whole and never reaches the kernel's runner, which an eager call does."""
    from quantcore.kernels.gated_activation import op

    h = _h(4, inter=1100, dtype=torch.bfloat16, seed=17)
    eager = gated_activation(h, "silu")
    reached: list[int] = []
    runner = op._runners[h.device]
    assert runner is not None
    monkeypatch.setitem(op._runners, h.device, lambda *a: reached.append(1) or runner(*a))
    compiled = torch.compile(lambda t: gated_activation(t, "silu"), fullgraph=True)
    got = compiled(h)
    assert not reached
    torch.testing.assert_close(got, eager)  # inductor's own exp: bf16's tolerance, not its bits
    assert torch.equal(gated_activation(h, "silu"), eager) and reached == [1]
