"""The tuned path of the act_quant_lora Triton kernel, run under the interpreter on the
CPU (or on a GPU if present): ``tune_tile`` over every shipped candidate, and the
``svdquant_prequant`` suite's ``+tuned`` variant, which on a GPU had failed on every row
while the bench only reported it as skipped."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)", allow_module_level=True)

from quantcore.backends.triton_ascend_int4 import TritonAscendInt4  # noqa: E402
from quantcore.backends.triton_nvfp4 import TritonNVFP4  # noqa: E402
from quantcore.benchmarks.suites import get_suite  # noqa: E402
from quantcore.errors import KernelInputError  # noqa: E402
from quantcore.formats.svdquant import SVDQuantAct  # noqa: E402
from quantcore.kernels.svdquant.triton_kernel import (  # noqa: E402
    CONFIGS,
    Tile,
    check_tile,
    smem_bytes,
    tune_tile,
)
from quantcore.ops.act_quant_lora import ActQuantLoraOutput, act_quant_lora_reference  # noqa: E402

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
N, R = 128, 16


def _setup(fp4: bool, seed: int) -> tuple[object, object, torch.Tensor, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    layer = {"lora_down": (torch.randn(N, R, generator=gen) * 0.05).to(torch.bfloat16),
             "smooth": torch.exp(torch.randn(N, generator=gen) * 0.5).to(torch.bfloat16)}
    fmt = SVDQuantAct(fp4=fp4)
    kernel = (TritonNVFP4 if fp4 else TritonAscendInt4)(fmt, DEVICE)
    prepared = kernel.prepare({k: t.to(DEVICE) for k, t in layer.items()}, dtype=torch.bfloat16)
    x = (torch.randn(24, N, generator=gen) * 2).to(torch.bfloat16)
    return kernel, prepared, x, layer


def _assert_golden(fmt: SVDQuantAct, out: ActQuantLoraOutput, x: torch.Tensor, layer: dict[str, torch.Tensor]) -> None:
    ref = act_quant_lora_reference(fmt, x, layer["lora_down"], layer["smooth"])
    bits = torch.uint8 if fmt.fp4 else torch.int16
    assert torch.equal(out.qout.cpu(), ref.qout)
    assert torch.equal(out.oscales.cpu().view(bits), ref.oscales.view(bits))
    torch.testing.assert_close(out.lora_act_out.cpu().double(), ref.lora_act_out, rtol=1e-5, atol=1e-6)


def _valid(fmt: SVDQuantAct) -> list[Tile]:
    out = []
    for tile in CONFIGS:
        try:
            check_tile(tile, fmt, R)
        except KernelInputError:
            continue
        if smem_bytes(tile, R) <= 200 * 1024:
            out.append(tile)
    return out


@pytest.mark.parametrize("fp4", [True, False], ids=["nvfp4", "int4"])
def test_tune_tile_times_every_valid_candidate_and_each_is_exact(fp4: bool) -> None:
    kernel, prepared, x, layer = _setup(fp4, seed=5 + fp4)
    results = tune_tile(kernel, x.to(DEVICE), prepared)
    valid = _valid(kernel.fmt)
    assert len(valid) >= 5  # the table is not reduced to a token
    assert sorted(map(repr, (t for t, _ in results))) == sorted(map(repr, valid))  # none failed
    seconds = [s for _, s in results]
    assert seconds == sorted(seconds) and all(s > 0 for s in seconds)
    for tile, _ in results:
        _assert_golden(kernel.fmt, kernel.forward(x.to(DEVICE), prepared, tile=tile), x, layer)


def test_tune_tile_names_the_failures_when_nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel, prepared, x, _ = _setup(True, seed=7)

    def broken(*args: object, **kwargs: object) -> None:
        raise AttributeError("'Tile' object has no attribute 'nothing'")

    monkeypatch.setattr(kernel, "forward", broken)
    with pytest.raises(KernelInputError, match=rf"no tile of {len(CONFIGS)} candidates runs.*bm 64, bn 64.*AttributeError"):
        tune_tile(kernel, x.to(DEVICE), prepared)


@pytest.mark.parametrize("fp4", [True, False], ids=["nvfp4", "int4"])
def test_bench_tuned_variant_runs_and_names_its_tile(fp4: bool) -> None:
    suite = get_suite("svdquant_prequant")
    kernel, prepared, x, layer = _setup(fp4, seed=9 + fp4)
    configs = CONFIGS[3:6]
    variant = suite._tuned_variant(kernel, [x.to(DEVICE)], prepared, 1, 1, 1, configs)
    assert variant.name == f"{kernel.name}+tuned" and variant.role == "kernel"
    best = next(t for t in configs if f"tuned tile: {t.describe()}" == variant.note)
    assert f"bm {best.bm}, bn {best.bn}, {best.num_warps} warps" in variant.note
    _assert_golden(kernel.fmt, variant.fn(0), x, layer)
