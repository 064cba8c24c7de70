"""The 256-row fp16 tile that computed garbage on the H100: its cause, and the check that
refuses it.

The cause (README.md here): with fp16 scales the pre-scaled kernel's sm_90 code rewrites
the registers a still-pending wgmma reads its dequantized weights from (Triton splits the
dot into four wgmmas and waits for all but three). The compile test finds those writes in
the SASS of that tile and in none of the tiles the kernel picks on an H100 — bf16 or
fp16, decode or prefill — so a Triton or ptxas upgrade that changes the register
allocation fails here, not on a GPU. ``check_tile`` refuses the pre-scaled fp16 tile on
sm_90 whoever asks for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from quantcore.backends.trtllm_moe.tiles import MoETile, check_tile, pick_tile, uses_wgmma
from quantcore.errors import KernelInputError
from quantcore.probe.card import CardKey
from quantcore.probe.card_tables import H100_SXM
from quantcore.triton.compile_report import tools_available

ROOT = Path(__file__).resolve().parents[2]
A100 = CardKey("sm_80", 108, 163, 2)
H200 = CardKey("sm_90", 132, 227, 4)
PERSISTENT_256 = MoETile(256, 128, 64, 8, 4, scheduled=True, scale_pairs=False)

SCRIPT = """
import json, torch
from dataclasses import asdict
from tools.compile_report.trtllm_moe_triton import compile_one
from quantcore.backends.trtllm_moe.tiles import MoETile, pick_tile
from quantcore.probe.card_tables import H100_SXM
bad = MoETile(256, 128, 64, 8, 4, scheduled=True, scale_pairs=False)
jobs = {("bad", "fp16", json.dumps(asdict(bad)), 8192)}
for t in (1, 16, 64, 512, 4096):
    for dtype, scale in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        tile = pick_tile(2 * t, 8, 4096, 128, scale_dtype=scale, card=H100_SXM)
        jobs.add(("picked", dtype, json.dumps(asdict(tile)), 2 * t))
for kind, dtype, spec, routes in sorted(jobs):
    r = compile_one(MoETile(**json.loads(spec)), routes=routes, dtype=dtype)
    print(json.dumps({"kind": kind, "dtype": dtype, "tile": r["tile"], "hazards": r["wgmma_hazards"],
                      "spill_stack": r["spill_stack"]}))
"""


@pytest.mark.skipif(not tools_available(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_the_picked_tiles_keep_wgmma_operands_until_their_wait_and_the_bad_tile_does_not() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=1200,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    bad = [r for r in rows if r["kind"] == "bad"]
    picked = [r for r in rows if r["kind"] == "picked"]
    assert len(bad) == 1 and bad[0]["hazards"] > 0, bad  # the cause, seen in its SASS
    assert {r["dtype"] for r in picked} == {"bf16", "fp16"} and len(picked) >= 6
    for r in picked:
        assert r["hazards"] == 0, r


def test_check_tile_refuses_pre_scaled_fp16_on_sm90_only() -> None:
    with pytest.raises(KernelInputError, match=r"pre_scale with torch.float16 scales on sm_90.*pre_scale=False"):
        check_tile(PERSISTENT_256, 8192, 4096, 128, scale_dtype=torch.float16, wgmma=True)
    with pytest.raises(KernelInputError, match="pre_scale"):
        check_tile(MoETile(16, 64, 128), 2, 4096, 128, scale_dtype=torch.float16, wgmma=True)
    # post-scaled, bf16 scales, or no wgmma (sm_80's mma.sync is synchronous): accepted
    check_tile(MoETile(256, 128, 64, 8, 4, scheduled=True, pre_scale=False), 8192, 4096, 128,
               scale_dtype=torch.float16, wgmma=True)
    check_tile(PERSISTENT_256, 8192, 4096, 128, scale_dtype=torch.bfloat16, wgmma=True)
    check_tile(PERSISTENT_256, 8192, 4096, 128, scale_dtype=torch.float16, wgmma=False)
    assert uses_wgmma(H100_SXM) and uses_wgmma(H200) and not uses_wgmma(A100) and not uses_wgmma(None)


@pytest.mark.parametrize("card", [H100_SXM, H200, A100, None], ids=["h100", "h200", "a100", "none"])
@pytest.mark.parametrize("group", [64, 128])
def test_every_picked_tile_passes_the_check(card: CardKey | None, group: int) -> None:
    for routes in (1, 2, 16, 32, 128, 1024, 8192):
        for scale in (torch.bfloat16, torch.float16):
            tile = pick_tile(routes, 8, 4096, group, scale_dtype=scale, card=card)
            check_tile(tile, routes, 4096, group, scale_dtype=scale, wgmma=uses_wgmma(card))
            if scale == torch.float16 and uses_wgmma(card):
                assert not tile.pre_scale, (card, routes, tile)


def test_the_kernel_refuses_a_requested_pre_scaled_fp16_tile_on_sm90(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check runs on every call with the card of the call's device, before anything
    launches: a caller's explicit tile cannot bypass it."""
    from quantcore.backends.trtllm_moe import triton_kernel
    from quantcore.formats.trtllm_moe import TRTLLMMoE

    monkeypatch.setattr(triton_kernel, "_facts", lambda device: (H100_SXM, 132))
    fmt = TRTLLMMoE(group_size=64)
    kernel = triton_kernel.TritonMoE(fmt, "cpu")
    w = kernel.prepare(fmt.quantize(torch.randn(2, 128, 64)), dtype=torch.float16)
    x = torch.randn(4, 128).half()
    ids = torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(KernelInputError, match=r"pre_scale with torch\.float16 scales on sm_90"):
        kernel.forward(x, ids, w, tile=MoETile(16, 64, 64))
