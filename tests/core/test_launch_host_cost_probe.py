"""The launch host-cost probe (``tools/probes/launch_host_cost.py``) runs on a CPU-only
torch: its stubbed runtime answers every CUDA query a launcher makes (the current device,
the device properties a card key is read from), puts back what it replaced, and the probe
times every Triton call path, module and custom op end to end in a subprocess (compiled
kernels, not the interpreter the test session uses), where no module runs more functions
around its kernel than ``QuantLinear``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from quantcore.probe import card_tables
from quantcore.probe.card_tables import H100_SXM, cuda_card
from tools.probes.launch_host_cost import stubbed

ROOT = Path(__file__).resolve().parents[2]
TRITON_PATHS = ["triton_int4", "turboquant_triton", "trtllm_moe_triton", "trtllm_moe_triton.forward", "triton_nvfp4"]
MODULES = ["QuantLinear (triton_int4)", "TurboQuantLinear (turboquant_triton)", "QuantExperts (trtllm_moe_triton)",
           "SVDQuantActQuant (triton_nvfp4)"]


def test_the_stub_answers_a_launchers_card_query_and_puts_the_runtime_back() -> None:
    current, properties = torch.cuda.current_device, torch.cuda.get_device_properties
    with stubbed(plain=False):
        # what triton_int4's launcher asks for a CPU tensor's card: the current device's key
        assert cuda_card(torch.device("cpu")) == H100_SXM
        assert cuda_card(None) == H100_SXM
    assert torch.cuda.current_device is current and torch.cuda.get_device_properties is properties
    assert card_tables._cuda_card.cache_info().currsize == 0  # no stubbed card outlives the stub


def test_the_probe_runs_every_path_on_a_cpu(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "tools.probes.launch_host_cost", "--calls", "3", "--repeats", "1",
           "--label", "test", "--json", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    (result,) = json.loads(out.read_text())
    assert result["label"] == "test" and result["unbound"] == []
    assert sorted(result["triton"]) == sorted(f"{p}/M{m}" for p in TRITON_PATHS for m in (1, 16))
    for times in result["triton"].values():
        assert times["bound"] > 0 and times["plain"] > 0
    assert sorted(result["modules"]) == sorted(f"{n}/M{m}" for n in MODULES for m in (1, 16))
    for times in result["modules"].values():
        assert min(times["kernel"], times["module"], times["custom_op"]) > 0
        assert times["module_over_kernel"] == times["module"] - times["kernel"]
    # a count of the functions a call runs does not move with the machine's load: no module
    # runs more around its kernel than QuantLinear does
    for m in (1, 16):
        linear = result["modules"][f"QuantLinear (triton_int4)/M{m}"]["functions_module_over_kernel"]
        assert 0 < linear <= 10
        for name in MODULES[1:]:
            assert result["modules"][f"{name}/M{m}"]["functions_module_over_kernel"] <= linear, name
