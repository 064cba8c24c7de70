"""What only a CUDA GPU can show: the compiled Triton kernels (``triton_nvfp4``,
``triton_ascend_int4``) and the torch backend against the golden reference bit for bit at
the format's target shapes and for every tile candidate (both E2M1 trees, stream-K grids that
split row tiles between programs), the integer fp8 rounding against
torch's ``float8_e4m3fn`` cast over every float32 bit pattern in the scales' range
[0, 448], and CUDA-graph capture.

Run with ``--qc-device cuda`` (otherwise the quantcore pytest plugin turns Triton's
interpreter on for the CPU): ``pytest tests/svdquant --qc-device cuda``.
"""

from __future__ import annotations

import pytest
import torch

from tests.compiled_cuda import skip_unless_compiled_cuda

skip_unless_compiled_cuda()
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

from quantcore.backends.svdquant_torch import TorchActQuantLora  # noqa: E402
from quantcore.backends.triton_ascend_int4 import TritonAscendInt4  # noqa: E402
from quantcore.backends.triton_nvfp4 import TritonNVFP4  # noqa: E402
from quantcore.formats.svdquant import SVDQuantAct  # noqa: E402
from quantcore.kernels.svdquant.triton_kernel import CONFIGS, Tile, pick_tile, smem_bytes  # noqa: E402
from quantcore.kernels.svdquant.triton_source import div6_rn, div7_rn, e4m3_scale_bits  # noqa: E402
from quantcore.ops.act_quant_lora import ActQuantLoraOutput, act_quant_lora_reference  # noqa: E402
from quantcore.tensors import ieee_div  # noqa: E402

DEV = "cuda"
CHUNK = 1 << 27


@triton.jit
def _e4m3_bits(f_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(out_ptr + offs, e4m3_scale_bits(tl.load(f_ptr + offs, mask=ok, other=0.0)).to(tl.uint8), mask=ok)


def test_e4m3_rounding_matches_torch_for_every_scale() -> None:
    """Every float32 bit pattern in [0, 448] (the scales the kernel rounds, 1.14e9 of
    them) against torch's float8_e4m3fn cast on this GPU."""
    top = 0x43E00000  # 448.0
    out = torch.empty(CHUNK, dtype=torch.uint8, device=DEV)
    for start in range(0, top + 1, CHUNK):
        n = min(CHUNK, top + 1 - start)
        f = torch.arange(start, start + n, dtype=torch.int32, device=DEV).view(torch.float32)
        _e4m3_bits[(triton.cdiv(n, 4096),)](f, out, n, BLOCK=4096)
        want = f.to(torch.float8_e4m3fn).view(torch.uint8)
        diff = out[:n] != want
        if diff.any():
            i = int(diff.nonzero()[0, 0])
            pytest.fail(f"{int(diff.sum())} patterns differ from {start:#x}; e.g. {f[i].item()!r}: "
                        f"{int(out[i]):#x} vs torch {int(want[i]):#x}")


@triton.jit
def _divs(f_ptr, out6_ptr, out7_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    a = tl.load(f_ptr + offs, mask=ok, other=0.0)
    tl.store(out6_ptr + offs, div6_rn(a), mask=ok)
    tl.store(out7_ptr + offs, div7_rn(a), mask=ok)


def test_divisions_by_6_and_7_match_ieee_for_every_float() -> None:
    """The kernel's ``amax / 6`` and ``amax / 7`` (one fused fma correcting ``a · fl(1/b)``,
    compiled without contraction elsewhere) against IEEE division (``ieee_div``), for every finite
    float32 from 2⁻¹²⁰ up (1.85e9 patterns; below, the quotients are far under every
    threshold the kernel compares them with)."""
    lo, top = 0x03800000, 0x7F800000  # 2^-120, +inf
    out6 = torch.empty(CHUNK, dtype=torch.float32, device=DEV)
    out7 = torch.empty(CHUNK, dtype=torch.float32, device=DEV)
    for start in range(lo, top, CHUNK):
        n = min(CHUNK, top - start)
        f = torch.arange(start, start + n, dtype=torch.int32, device=DEV).view(torch.float32)
        _divs[(triton.cdiv(n, 4096),)](f, out6, out7, n, BLOCK=4096, enable_fp_fusion=False)
        for b, out in ((6.0, out6), (7.0, out7)):
            diff = out[:n].view(torch.int32) != ieee_div(f, b).view(torch.int32)
            if diff.any():
                i = int(diff.nonzero()[0, 0])
                pytest.fail(f"/{b}: {int(diff.sum())} differ from {start:#x}; e.g. {f[i].item()!r}: {out[i].item()!r}")


def _layer(n: int, r: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "lora_down": (torch.randn(n, r, generator=gen) * 0.05).to(torch.bfloat16),
        "smooth": torch.exp(torch.randn(n, generator=gen) * 0.5).to(torch.bfloat16),
    }


def _check(out: ActQuantLoraOutput, ref: ActQuantLoraOutput, fp4: bool, what: str) -> None:
    bits = torch.uint8 if fp4 else torch.int16
    q = out.qout.cpu() != ref.qout
    s = out.oscales.cpu().view(bits) != ref.oscales.view(bits)
    assert not q.any() and not s.any(), f"{what}: {int(q.sum())} code bytes, {int(s.sum())} scales differ"
    gold = ref.lora_act_out
    fin = torch.isfinite(gold)
    lora = out.lora_act_out.cpu().double()
    assert torch.equal(lora.isnan(), gold.isnan()), what
    if fin.any():
        rel = float((lora[fin] - gold[fin]).norm() / gold[fin].norm().clamp_min(1e-30))
        assert rel <= 1e-5, f"{what}: lora rel {rel:.2e}"


@pytest.mark.parametrize("fp4", [True, False], ids=["nvfp4", "int4"])
@pytest.mark.parametrize(("n", "r"), [(3840, 32), (3840, 128), (10240, 32), (10240, 128)])
def test_seed_shapes_bit_exact(fp4: bool, n: int, r: int) -> None:
    fmt = SVDQuantAct(fp4=fp4)
    gen = torch.Generator().manual_seed(n + r)
    x = (torch.randn(4352, n, generator=gen) * 2).to(torch.bfloat16)
    layer = _layer(n, r, gen)
    ref = act_quant_lora_reference(fmt, x, layer["lora_down"], layer["smooth"])
    dev_layer = {k: v.to(DEV) for k, v in layer.items()}
    for cls in (TritonNVFP4 if fp4 else TritonAscendInt4, TorchActQuantLora):
        kernel = cls(fmt, DEV)
        out = kernel(x.to(DEV), kernel.prepare(dev_layer, dtype=torch.bfloat16))
        _check(out, ref, fp4, f"{cls.name} N{n} R{r}")


@pytest.mark.parametrize("fp4", [True, False], ids=["nvfp4", "int4"])
def test_every_tile_candidate_bit_exact(fp4: bool) -> None:
    fmt = SVDQuantAct(fp4=fp4)
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(512, 3840, generator=gen) * 2).to(torch.float16)
    x[0] = 0
    x[1, 5] = float("nan")
    x[2, 100] = float("-inf")
    x[3] = -0.0
    layer = _layer(3840, 128, gen)
    ref = act_quant_lora_reference(fmt, x, layer["lora_down"], layer["smooth"])
    kernel = (TritonNVFP4 if fp4 else TritonAscendInt4)(fmt, DEV)
    prepared = kernel.prepare({k: v.to(DEV) for k, v in layer.items()}, dtype=torch.float16)
    tiles = [t for t in CONFIGS if t.bn % fmt.block == 0 and smem_bytes(t, 128) <= 200 * 1024]
    tiles += [pick_tile(512, 3840, 128, fp4), Tile(16, 64, grid=5), Tile(64, 64, grid=7, tree=0), Tile(32, 64, grid=1),
              Tile(64, 64, grid=528, maxnreg=128), Tile(64, 128, grid=396, maxnreg=168)]
    for tile in tiles:
        _check(kernel.forward(x.to(DEV), prepared, tile=tile), ref, fp4, str(tile))


@pytest.mark.parametrize("fp4", [True, False], ids=["nvfp4", "int4"])
def test_cuda_graph_replay(fp4: bool) -> None:
    fmt = SVDQuantAct(fp4=fp4)
    gen = torch.Generator().manual_seed(9)
    layer = {k: v.to(DEV) for k, v in _layer(3840, 32, gen).items()}
    kernel = (TritonNVFP4 if fp4 else TritonAscendInt4)(fmt, DEV)
    prepared = kernel.prepare(layer, dtype=torch.bfloat16)
    x = (torch.randn(300, 3840, generator=gen) * 2).to(DEV, torch.bfloat16)
    kernel.forward(x, prepared)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.forward(x, prepared)
    for replay in range(2):  # the row tiles' tickets are back at zero after each replay
        x.copy_((torch.randn(300, 3840, generator=gen) * 2).to(DEV, torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        ref = act_quant_lora_reference(fmt, x.cpu(), layer["lora_down"].cpu(), layer["smooth"].cpu())
        _check(out, ref, fp4, f"graph replay {replay}")


@pytest.mark.parametrize("fp4", [True, False], ids=["nvfp4", "int4"])
@pytest.mark.parametrize(("m", "n", "r"), [(256, 3840, 32), (256, 10240, 128), (4352, 3840, 128)])
def test_small_batch_bit_exact_and_deterministic(fp4: bool, m: int, n: int, r: int) -> None:
    """The benchmark's small batch (its row tiles shared by many programs) against the
    golden, and the LoRA output bit-identical over repeated calls (the partials of a shared
    row tile are summed in a fixed order whichever program finishes last)."""
    fmt = SVDQuantAct(fp4=fp4)
    gen = torch.Generator().manual_seed(m + n + r)
    x = (torch.randn(m, n, generator=gen) * 2).to(torch.bfloat16)
    layer = _layer(n, r, gen)
    kernel = (TritonNVFP4 if fp4 else TritonAscendInt4)(fmt, DEV)
    prepared = kernel.prepare({k: v.to(DEV) for k, v in layer.items()}, dtype=torch.bfloat16)
    outs = [kernel(x.to(DEV), prepared) for _ in range(5)]
    _check(outs[0], act_quant_lora_reference(fmt, x, layer["lora_down"], layer["smooth"]), fp4, f"M{m} N{n} R{r}")
    for out in outs[1:]:
        assert torch.equal(out.lora_act_out.view(torch.int32), outs[0].lora_act_out.view(torch.int32))
