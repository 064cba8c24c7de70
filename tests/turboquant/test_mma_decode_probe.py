"""The TurboQuant ``mma.sync`` decode probe (``tools/probes/turboquant_mma_decode.py``) on
the CPU: its pair-word layout gives the indices back, the operand the kernel reads (its
reshape and byte lookup replayed) holds the right codes, its arithmetic replayed in torch
stays within the shipped path's error of the float64 golden, and the kernel compiles for
sm_90a without spills."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from quantcore.triton.compile_report import tools_available
from tests.triton_release import needs_gluon_release
from tools.probes import turboquant_mma_decode as probe


def _indices(n: int, k: int, passes: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen) for _ in range(passes)]


@pytest.mark.parametrize(("n", "k", "passes"), [(64, 128, 1), (100, 384, 1), (130, 256, 2), (64, 1408, 2)])
def test_pair_words_invert(n: int, k: int, passes: int) -> None:
    idx = _indices(n, k, passes)
    frag = probe.pair_words(idx)
    assert frag.dtype == torch.int32 and frag.shape == (-(-n // 64), passes * k // 128 * 1024)
    for got, want in zip(probe.unpack_pair_words(frag, n, k, passes), idx, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("passes", [1, 2])
def test_operand_holds_the_codes_of_its_block(passes: int) -> None:
    n, k = 128, 512
    idx = _indices(n, k, passes, seed=1)
    # Codes [N, K] per pass: coordinate 2j low nibble of byte j.
    codes = [torch.stack(((i & 15), (i >> 4)), -1).reshape(n, k).long() for i in idx]
    frag = probe.pair_words(idx)
    for tile in range(n // 64):
        for block in range(passes * k // 128):
            g, p = divmod(block, passes)
            for sl in range(4):
                want = codes[p][64 * tile:64 * tile + 64, 128 * g + 32 * sl:128 * g + 32 * sl + 32]
                assert torch.equal(probe.operand_codes(frag, tile, block, sl), want), (tile, block, sl)


@pytest.mark.parametrize("residual", [False, True])
def test_emulated_arithmetic_against_the_golden(residual: bool) -> None:
    from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
    from quantcore.formats.turboquant import TurboQuant

    fmt = TurboQuant(bits=4, group_size=128, residual=residual)
    gen = torch.Generator().manual_seed(0)
    k, n = 384, 200
    tensors = fmt.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen)
    tensors["bias"] = torch.randn(n, generator=gen) * 0.01
    w = probe.prepare(TurboQuantTriton(fmt, "cpu").prepare(tensors, dtype=torch.bfloat16))
    x = torch.randn(8, k, generator=gen).to(torch.bfloat16)
    golden = x.double() @ fmt.dequantize(tensors).T + tensors["bias"].double()
    err = float((probe.emulate(x, w).double() - golden).norm() / golden.norm())
    assert err < 4e-3, err


_SCRIPT = """
import json
from tools.probes.turboquant_mma_decode import compile_report
for kw in [dict(), dict(copies=32), dict(fp16=True), dict(groups=2), dict(steps=28), dict(tiles=2, copies=32)]:
    print(json.dumps(compile_report(**kw)))
"""


@pytest.mark.skipif(not tools_available(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
@needs_gluon_release
def test_kernel_compiles_for_sm90_without_spills() -> None:
    env = {a: v for a, v in os.environ.items() if a != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 6
    for r in rows:
        walk = r["walk"]
        assert r["spill_stack"] == 0, r
        # Two steps a trip, four slices a step, one m16n8k16 per k16 half and K-group (its x columns).
        assert walk["HMMA"] == 2 * 4 * 2 * r["groups"], walk
        assert r["lds_per_code"] == 0.5, r  # one table load per pair of weights
        assert walk["LDSM"] > 0 and not {"STS", "STL", "LDL", "BAR"} & set(walk), walk
    assert rows[0]["per_code"] <= 2.4, rows[0]
