"""``hopper_wgmma``'s codebook operand (``LOOKUP``, ``backends/hopper_wgmma/codebook.py``)
on any machine: its PTX run instruction by instruction over random words, codebooks and
scales against the pair it must make; TurboQuant's passes laid out as one code matrix
(``tools/probes/turboquant_hopper.py``) whose dequantized weight is the layer's; and the
kernel compiled for sm_90a. The GPU runs are ``test_lookup_cuda.py``."""

from __future__ import annotations

import re
import struct

import pytest
import torch

from quantcore.backends.hopper_wgmma.codebook import (
    CODEBOOK_FILL_ASM,
    CODEBOOK_SYMBOL,
    lookup_pair_asm_text,
)
from tests.triton_release import needs_gluon_release

from .test_sm90_compile import _bundled_tools, assert_clean_kernels, compiled_rows


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _half(value: float, fp16: bool) -> int:
    dtype = torch.float16 if fp16 else torch.bfloat16
    return int(torch.tensor(value, dtype=torch.float32).to(dtype).view(torch.int16).item()) & 0xFFFF


def _run(asm: str, word: int, scales: tuple[float, float], table: list[float], fp16: bool) -> int:
    """The pair PTX of ``asm`` over one word: each instruction as PTX defines it, the table
    at address 0 of shared memory (the only instructions the text may hold)."""
    body = asm.strip()[1:-1]
    regs: dict[str, int] = {"$1": word, "$2": _bits(scales[0]), "$3": _bits(scales[1])}

    def val(tok: str) -> int:
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return int(tok, 0)

    for stmt in (s.strip() for s in body.split(";") if s.strip()):
        if stmt.startswith(".reg"):
            continue
        op, rest = stmt.split(None, 1)
        args = [a.strip() for a in rest.split(",")]
        if op == "mov.u32" and args[1] == CODEBOOK_SYMBOL:
            regs[args[0]] = 0
        elif op == "shl.b32":
            regs[args[0]] = (val(args[1]) << val(args[2])) & 0xFFFFFFFF
        elif op == "shr.u32":
            regs[args[0]] = val(args[1]) >> val(args[2])
        elif op == "and.b32":
            regs[args[0]] = val(args[1]) & val(args[2])
        elif op == "add.u32":
            regs[args[0]] = (val(args[1]) + val(args[2])) & 0xFFFFFFFF
        elif op == "ld.shared.f32":
            addr = val(re.fullmatch(r"\[(.+)\]", args[1]).group(1))  # type: ignore[union-attr]
            assert addr % 4 == 0 and addr < 64, f"a lookup outside the 16-entry table: {addr}"
            regs[args[0]] = _bits(table[addr // 4])
        elif op == "mul.rn.f32":
            regs[args[0]] = _bits(float(torch.tensor(_f32(val(args[1])), dtype=torch.float32)
                                        * torch.tensor(_f32(val(args[2])), dtype=torch.float32)))
        elif op in ("cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32"):
            assert (op == "cvt.rn.f16x2.f32") == fp16
            regs[args[0]] = (_half(_f32(val(args[1])), fp16) << 16) | _half(_f32(val(args[2])), fp16)
        else:
            raise AssertionError(f"an instruction this test does not know: {stmt!r}")
    return regs["$0"]


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("field", range(4))
def test_a_pair_is_each_halfs_centroid_times_its_scale(fp16: bool, field: int) -> None:
    gen = torch.Generator().manual_seed(17 * field + fp16)
    asm = lookup_pair_asm_text(fp16, 4 * field)
    for _ in range(64):
        table = (torch.randn(16, generator=gen) * 2).tolist()
        table = [_f32(_bits(v)) for v in table]  # float32 values
        word = int(torch.randint(0, 2**32, (1,), generator=gen, dtype=torch.int64).item())
        s = _f32(_bits(float(torch.rand(1, generator=gen).item() * 0.1 + 1e-3)))
        q0, q1 = (word >> (4 * field)) & 15, (word >> (16 + 4 * field)) & 15
        want = []
        for q in (q0, q1):
            prod = float(torch.tensor(table[q], dtype=torch.float32) * torch.tensor(s, dtype=torch.float32))
            want.append(_half(prod, fp16))
        assert _run(asm, word, (s, s), table, fp16) == (want[1] << 16) | want[0], (field, hex(word))


def test_the_table_is_declared_once_at_1024_byte_alignment() -> None:
    # Static shared memory precedes the kernel's TMA buffers, whose swizzled tiles need
    # 1024-byte alignment (codebook.py).
    assert f".shared .align 1024 .b8 {CODEBOOK_SYMBOL}[1024];" in CODEBOOK_FILL_ASM
    assert CODEBOOK_FILL_ASM.count(".shared .align") == 1
    assert all(".shared .align" not in lookup_pair_asm_text(f, 4 * i) for f in (False, True) for i in range(4))


@pytest.mark.parametrize("residual", [False, True])
def test_the_laid_out_codes_are_the_layers_weight(residual: bool) -> None:
    """Every pass's codes and scales in the one matrix, group by group, in the order the
    rotated x is interleaved: the layout's inverse and the layer's own golden agree."""
    from quantcore.backends.hopper_wgmma.layout import hopper_to_rows
    from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
    from quantcore.formats.turboquant import TurboQuant
    from tools.probes.turboquant_hopper import golden_output, rotated, tq_to_hopper

    fmt = TurboQuant(bits=4, group_size=128, residual=residual)
    gen = torch.Generator().manual_seed(3)
    prep = TurboQuantTriton(fmt, "cpu").prepare(fmt.quantize(torch.randn(192, 384, generator=gen) * 0.02,
                                                             generator=gen))
    w = tq_to_hopper(prep)
    rows = hopper_to_rows(w)
    w_hat = w.codebook.double()[rows.codes.long()] * rows.scales.double().t().repeat_interleave(128, 1)
    x = torch.randn(5, 384, generator=gen)
    got = rotated(x, prep).double() @ w_hat.t()
    want = golden_output(x, prep)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6 * float(want.abs().max()))


@needs_gluon_release
@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_the_lookup_kernel_compiles_for_sm90() -> None:
    script = """
import json, torch
from tools.probes.turboquant_hopper import compile_lookup
for text, m, dtype in (("1,16,4,4,in_flight", 16, torch.bfloat16), ("2,128,4,1,in_flight,ws", 128, torch.float16),
                       ("1,64,5,2,in_flight", 64, torch.bfloat16)):
    print(json.dumps(compile_lookup(text, m, dtype)))
"""
    rows = compiled_rows(script)
    assert_clean_kernels(rows, 3, hgmma=16)  # 4-bit: four slices of two k16 steps, two blocks a trip
    # Two lookups a pair: each thread holds 8 pairs of a slice, 4 slices, 2 blocks a trip.
    assert all(r["lds"] >= 2 * 8 * 4 * 2 for r in rows), rows


@needs_gluon_release
@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_the_decode_kernels_lookup_compiles_for_sm90() -> None:
    script = """
import json
from quantcore.backends.hopper_wgmma.decode import compile_report
for fp16 in (False, True):
    print(json.dumps(compile_report(lookup=True, fp16=fp16)))
"""
    for r in compiled_rows(script):
        assert r["spill_stack"] == 0, r
        # A trip of two steps: 8 pairs a slice a thread, 4 slices, two lookups and one
        # conversion a pair; no multiply (the scale goes on each group's product).
        assert r["walk"]["LDS"] == 2 * 8 * 4 * 2 and r["walk"]["F2FP"] == 8 * 4 * 2, r
