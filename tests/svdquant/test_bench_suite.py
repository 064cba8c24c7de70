"""The svdquant_prequant bench suite on CPU: its cases, peers, bytes and target notes,
and ``quantcore bench svdquant_prequant --device cpu --shape ...`` as a smoke run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from quantcore.benchmarks.suites import get_suite
from quantcore.formats.svdquant import SVDQuantAct


def test_small_case_has_peers_bytes_and_outputs() -> None:
    suite = get_suite("svdquant_prequant")
    cases = list(suite.cases("cpu", [{"M": 1, "N": 64, "R": 32}]))
    assert [c.label for c in cases] == ["nvfp4-M1-N64-R32", "int4-M1-N64-R32"]
    for case in cases:
        names = {v.name: v for v in case.variants}
        assert names["svdquant_torch"].role == "peer" and names["cublas_lora_down"].role == "peer"
        for v in case.variants:
            out = v.fn(0)
            assert v.flops == 2 * 1 * 64 * 32
            if v.name == "cublas_lora_down":
                assert out.shape == (1, 32) and v.bytes == 2 * 64 + 2 * 64 * 32 + 2 * 32
            else:  # the op: padded outputs
                assert out.qout.shape == (256, 32) and out.lora_act_out.shape == (256, 32)
    fmt = SVDQuantAct(fp4=True)
    # x bf16 + lora_down + 1/smooth fp32 + codes + fp8 scales + fp32 LoRA, M padded to 4352
    assert suite.op_bytes(fmt, 4352, 3840, 32) == (2 * 4352 * 3840 + 2 * 3840 * 32 + 4 * 3840
                                                   + 4352 * 1920 + 4352 * 240 + 4 * 4352 * 32)


def test_summary_states_the_targets() -> None:
    suite = get_suite("svdquant_prequant")
    big, small = {"M": 4352, "N": 10240, "R": 32}, {"M": 256, "N": 3840, "R": 128}
    rows = [
        {"variant": "triton_nvfp4", "role": "kernel", "case": "nvfp4-M4352-N10240-R32", "dims": big,
         "copy_share": 0.83, "speedup_vs": {"cublas_lora_down": 1.3}},
        {"variant": "triton_nvfp4", "role": "kernel", "case": "nvfp4-M4352-N10240-R32", "dims": big,
         "copy_share": 0.83, "speedup_vs": {"cublas_lora_down": 0.95}},
        {"variant": "triton_ascend_int4", "role": "kernel", "case": "int4-M256-N3840-R128", "dims": small,
         "copy_share": 0.6, "speedup_vs": {"svdquant_torch": 20.0}},
        {"variant": "svdquant_torch", "role": "peer", "case": "x", "dims": big, "copy_share": 0.1, "speedup_vs": {}},
    ]
    assert suite.summarize(rows) == [
        "nvfp4-M4352-N10240-R32 triton_nvfp4: 83% of copy, 1.30× cuBLAS LoRA-down alone "
        "(target ≥ 80% of copy, ≥ 1.0× cuBLAS): met",
        "nvfp4-M4352-N10240-R32 triton_nvfp4: 83% of copy, 0.95× cuBLAS LoRA-down alone "
        "(target ≥ 80% of copy, ≥ 1.0× cuBLAS): missed",
        "int4-M256-N3840-R128 triton_ascend_int4: 60% of copy, 20.00× unfused (target ≥ 60% of copy): met",
    ]


def test_cli_smoke_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"QUANTCORE_CACHE": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "quantcore", "bench", "svdquant_prequant", "--device", "cpu",
         "--shape", "M=1,N=64,R=32,fp4=1", "--rounds", "2", "--out", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert out.returncode == 0, out.stderr
    for word in ("svdquant_torch", "cublas_lora_down", "vs svdquant_torch", "of copy BW", "TRITON_INTERPRET"):
        assert word in out.stdout
    (page,) = (tmp_path / "results").glob("*.md")
    data = json.loads((tmp_path / "results" / page.stem / "svdquant_prequant.json").read_text())
    assert {r["variant"] for r in data["rows"]} >= {"svdquant_torch", "cublas_lora_down", "triton_nvfp4"}
    assert torch.__version__ == data["torch"]
