"""``gated_activation`` on the CPU (torch's ops): the halves it reads and the rounding it
gives, the shapes and strides it takes, what it refuses and how it names it, its one
table of activations, and that ``torch.compile`` traces it whole."""

from __future__ import annotations

import pytest
import torch

from quantcore.checkpoint import parallel
from quantcore.errors import InvalidArgumentError, KernelInputError, QuantCoreError
from quantcore.kernels.gated_activation import (
    ACTIVATIONS,
    KERNEL_DTYPES,
    check_gated,
    gated_activation,
    why_torch,
)

DTYPES = (*KERNEL_DTYPES, torch.float64)


def _h(*lead: int, inter: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*lead, 2 * inter, generator=gen) * 3).to(dtype)


def test_one_table_of_three_activations_which_the_block_takes() -> None:
    assert sorted(ACTIVATIONS) == ["gelu", "relu", "silu"]
    assert parallel.ACTIVATIONS is ACTIVATIONS
    g = torch.randn(64, dtype=torch.float64)
    close = {"rtol": 1e-14, "atol": 1e-14}  # float64: what each is, not how torch rounds it
    torch.testing.assert_close(ACTIVATIONS["silu"](g), g * torch.sigmoid(g), **close)
    torch.testing.assert_close(ACTIVATIONS["gelu"](g), g * 0.5 * (1 + torch.erf(g / 2 ** 0.5)), **close)  # not tanh
    assert torch.equal(ACTIVATIONS["relu"](g), g.clamp_min(0))


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gate_is_the_first_half_and_up_the_second(activation: str, dtype: torch.dtype) -> None:
    inter = 37
    h = _h(5, inter=inter, dtype=dtype, seed=1)
    got = gated_activation(h, activation)
    act = ACTIVATIONS[activation]
    assert got.shape == (5, inter) and got.dtype == dtype
    assert torch.equal(got, act(h[:, :inter]) * h[:, inter:])
    if dtype in (torch.bfloat16, torch.float16):
        # the product of the two dtype values in float32, rounded once (exact in float32)
        assert torch.equal(got, (act(h[:, :inter]).float() * h[:, inter:].float()).to(dtype))
    assert not torch.equal(got, act(h[:, inter:]) * h[:, :inter])  # the order is not symmetric


@pytest.mark.parametrize("shape", [(12,), (2, 3, 12), (4, 1, 12)])
def test_leading_dims_are_rows(shape: tuple[int, ...]) -> None:
    h = torch.randn(*shape).bfloat16()
    got = gated_activation(h, "silu")
    assert got.shape == (*shape[:-1], 6)
    assert torch.equal(got.reshape(-1, 6), gated_activation(h.reshape(-1, 12), "silu"))


def test_rows_of_a_larger_buffer_are_taken_at_their_stride() -> None:
    buf = torch.randn(6, 40).bfloat16()
    h = buf[1:5, 3:27]  # rows 40 elements apart, unit stride within a row
    assert torch.equal(gated_activation(h, "gelu"), gated_activation(h.contiguous(), "gelu"))
    lead = buf.view(2, 3, 40)[:, :, :24]  # leading dims that still read as rows at one stride
    assert torch.equal(gated_activation(lead, "relu"), gated_activation(lead.contiguous(), "relu"))


def test_empty_rows_or_columns_give_empty_outputs() -> None:
    assert gated_activation(torch.empty(0, 8), "silu").shape == (0, 4)
    assert gated_activation(torch.empty(3, 0), "silu").shape == (3, 0)


@pytest.mark.parametrize(("h", "activation", "error", "words"), [
    (torch.randn(2, 7), "silu", KernelInputError, ["h", "even last dim", "(2, 7)"]),
    (torch.randn(2, 8), "swish", InvalidArgumentError, ["activation", "'gelu', 'relu', 'silu'", "'swish'"]),
    (torch.randn(2, 8), None, InvalidArgumentError, ["activation", "None"]),
    (torch.randint(0, 5, (2, 8)), "silu", KernelInputError, ["h", "bf16/fp16/fp32/fp64", "int64"]),
    (torch.randn(2, 8).to(torch.float8_e4m3fn), "relu", KernelInputError, ["h", "float8_e4m3fn"]),
    (torch.randn(8, 2).T, "silu", KernelInputError, ["h", "unit stride along the last dim", "(1, 2)"]),
    (torch.randn(3, 4, 8).transpose(0, 1), "silu", KernelInputError, ["h", "rows at one stride", "(8, 32, 1)"]),
    (torch.tensor(1.0), "silu", KernelInputError, ["h", "()"]),
    ([[1.0, 2.0]], "silu", KernelInputError, ["h", "list"]),
], ids=["odd", "unknown-activation", "activation-none", "int", "fp8", "column-strided", "rows-not-one-stride",
        "0-d", "not-a-tensor"])
def test_bad_input_is_refused_naming_the_parameter(h: object, activation: object, error: type[QuantCoreError],
                                                   words: list[str]) -> None:
    for call in (gated_activation, check_gated):
        with pytest.raises(error) as caught:
            call(h, activation)  # type: ignore[arg-type]
        for word in words:
            assert word in str(caught.value), (word, str(caught.value))


def test_torch_compile_traces_the_call_whole() -> None:
    """dynamo sees torch's ops (no graph break), and the result is the eager one."""
    h = _h(3, inter=16, dtype=torch.bfloat16, seed=2)
    compiled = torch.compile(lambda t: gated_activation(t, "silu"), backend="eager", fullgraph=True)
    assert torch.equal(compiled(h), gated_activation(h, "silu"))


def test_the_cpu_runs_torchs_ops_and_says_why() -> None:
    assert why_torch("cpu") == "the kernel runs on CUDA devices, not cpu"


def test_a_triton_older_than_the_tested_one_keeps_torchs_ops_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.kernels.gated_activation import op
    from quantcore.probe import Capabilities, PackageStatus

    old = Capabilities(device="cuda:0", device_type="cuda", available=True, compute_capability=(9, 0),
                       torch_version=torch.__version__, packages=(PackageStatus("triton", "3.4.0", True),))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(op, "probe", lambda device: old)
    assert op._unusable(torch.device("cuda", 0)) == "package triton: 3.4.0 installed, needs 3.6 or newer"
    current = Capabilities(device="cuda:0", device_type="cuda", available=True, compute_capability=(9, 0),
                           torch_version=torch.__version__, packages=(PackageStatus("triton", "3.6.0", True),))
    monkeypatch.setattr(op, "probe", lambda device: current)
    assert op._unusable(torch.device("cuda", 0)) == ""
