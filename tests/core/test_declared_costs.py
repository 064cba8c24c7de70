"""The built-in kernels' declared costs agree with the committed measurements: for every
case of every linear-like suite in ``benchmarks/results`` (the H100's, the H200's and this
CPU's), the kernel ``get_kernel`` chooses from the declarations alone (no measured table)
runs within ``GOAL``× the fastest kernel that keeps the weight compressed, as measured; and
with ``allow_dense=True`` within ``GOAL``× the fastest of all."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import quantcore.measured as measured
import quantcore.selection as selection
from quantcore.benchmarks.choice import GOAL
from quantcore.benchmarks.report import RESULTS
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.ops.act_quant_lora import act_quant_lora_problem
from quantcore.ops.moe import moe_problem
from quantcore.probe import Capabilities, PackageStatus, probe
from quantcore.problem import Problem
from quantcore.registry import Registry

SUITES = ("gptq_linear", "awq_linear", "gptq8_linear", "turboquant_linear", "trtllm_moe", "svdquant_prequant")
H100 = Capabilities(
    device="cuda:0", device_type="cuda", available=True, name="NVIDIA H100 80GB HBM3",
    compute_capability=(9, 0), torch_version=torch.__version__,
    packages=(PackageStatus("triton", "3.6.0", True), PackageStatus("cuda.tile", None, False, "not installed"),
              PackageStatus("tensorrt_llm", None, False, "not installed")),
    aten_ops=frozenset({"_convert_weight_to_int4pack", "_weight_int4pack_mm"}), fp8=True)
DEVICES = {
    "nvidia-h100-80gb-hbm3": H100,
    "nvidia-h200": dataclasses.replace(H100, name="NVIDIA H200"),  # the same sm_90 probe, its own rates
    "amd-epyc": dataclasses.replace(
        probe("cpu"), name="AMD EPYC", packages=(PackageStatus("triton", "3.6.0", False, "no GPU"),)),
}


def _problems(suite: str, dims: dict[str, int], variant: str) -> tuple[Problem, str]:
    """The problem a row timed, and the kernel name (without the suite's tag)."""
    from quantcore.benchmarks.suites import get_suite

    mod = get_suite(suite)
    if suite in ("gptq_linear", "awq_linear", "gptq8_linear"):
        return Problem.linear(mod.FMT, M=dims["M"], K=dims["K"], N=dims["N"], dtype=mod.DTYPE), variant
    if suite == "turboquant_linear":
        fmt = dataclasses.replace(mod.FMT, residual=variant.endswith("+res"))
        return Problem.linear(fmt, M=dims["M"], K=dims["K"], N=dims["N"], dtype=mod.DTYPE), variant.removesuffix("+res")
    if suite == "trtllm_moe":
        return moe_problem(mod.FMT, **{d: dims[d] for d in ("T", "E", "topk", "K", "N")}, dtype=mod.DTYPE), variant
    fmt = SVDQuantAct(fp4=bool(dims["fp4"]))
    return act_quant_lora_problem(fmt, M=dims["M"], N=dims["N"], R=dims["R"], dtype=mod.DTYPE), variant


def _groups() -> Iterator[Any]:
    for device, caps in DEVICES.items():
        for suite in SUITES:
            path = RESULTS / device / f"{suite}.json"
            if not path.exists():
                continue
            groups: dict[tuple[str, str], dict[str, Any]] = {}
            for r in json.loads(path.read_text())["rows"]:
                if r["role"] == "skipped" or r["variant"].endswith("+tuned"):
                    continue
                problem, kernel = _problems(suite, r["dims"], r["variant"])
                g = groups.setdefault((r["case"], problem.format.slug), {"problem": problem, "times": {}})
                g["times"][kernel] = r["time_s"]
            for (case, slug), g in groups.items():
                yield pytest.param(caps, g["problem"], g["times"], id=f"{device}/{suite}/{case}/{slug}")


@pytest.fixture
def declared_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTCORE_CACHE", str(tmp_path))
    monkeypatch.setattr(measured, "SHIPPED", tmp_path / "none")


@pytest.mark.parametrize(("caps", "problem", "times"), list(_groups()))
def test_declared_costs_choose_as_measured(caps: Capabilities, problem: Problem, times: dict[str, float],
                                           registry: Registry, declared_only: None,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "probe", lambda device: caps)
    if caps.device_type == "cuda":
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the GPUs' rows are compiled runs
    kernels = {e.cls.name: e.cls for e in registry.kernels(problem.format.name, problem.op)}
    timed = {k: t for k, t in times.items() if k in kernels}
    if "torch_fallback" not in timed and "dense_bf16" in times:
        timed["torch_fallback"] = times["dense_bf16"]  # turboquant_linear times the fallback as its dense peer
    # Only kernels the committed run timed can be judged (a kernel added since competes in
    # the next run of the suite).
    monkeypatch.setenv("QUANTCORE_DISABLE", ",".join(sorted(set(kernels) - set(timed))))
    expl = selection.explain(problem.format, caps.device, problem=problem, registry=registry)
    chosen = expl.selected.kernel
    assert chosen in timed, f"{chosen} was not timed in the committed run: {sorted(timed)}"
    compressed = [t for k, t in timed.items() if not kernels[k].keeps_dense_weight]
    best = min(compressed) if compressed else min(timed.values())
    assert timed[chosen] <= GOAL * best, (
        f"declared costs chose {chosen} ({timed[chosen] * 1e6:.1f} µs); fastest compressed {best * 1e6:.1f} µs\n{expl}")
    dense_ok = selection.explain(problem.format, caps.device, problem=problem, allow_dense=True, registry=registry)
    chosen = dense_ok.selected.kernel
    if chosen in timed:
        assert timed[chosen] <= GOAL * min(timed.values()), (
            f"allow_dense: declared costs chose {chosen} ({timed[chosen] * 1e6:.1f} µs), fastest of all "
            f"{min(timed.values()) * 1e6:.1f} µs\n{dense_ok}")
