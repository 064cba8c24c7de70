"""The model_decode bench suite on the CPU with a toy config: every kind of case (compiled
decode, prefill, eager decode) builds and runs each variant — fused ones included, the
CUDA-only peer skipped with its reason —, compiled decoding gives what eager decoding
gives, each row carries its logits' error against the float reference of the same
weights, and the summary tells tokens/s, ratios, quality and targets. No timing: the
numbers are the GPU run's."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

VARIANTS = "bf16,gptq4-g128-fused,tq4-g128-fused,tinygemm"


@pytest.fixture
def suite(monkeypatch: pytest.MonkeyPatch):
    from quantcore.benchmarks.suites import model_decode

    monkeypatch.setenv(model_decode.VARIANTS_ENV, VARIANTS)
    yield model_decode
    model_decode._built.clear()


def _tiny(suite, **change: int) -> dict[str, int]:
    return {**suite.SHAPES["tiny"][0], **change}


def test_every_kind_of_case_runs_each_variant_and_judges_it_against_its_float_reference(suite) -> None:
    from quantcore.benchmarks.decode import Decoder

    shapes = [_tiny(suite, B=2, T=3), _tiny(suite, P=8, T=0), _tiny(suite, T=2, C=0)]
    cases = list(suite.cases("cpu", shapes))
    assert [c.label for c in cases] == ["B2-T3-L2-H128", "prefill-B1-P8-L2-H128", "B1-T2-L2-H128-eager"]
    for case in cases:
        assert [v.name for v in case.variants] == ["bf16", "gptq4-g128-fused", "tq4-g128-fused"]
        assert "runs on CUDA only" in case.skipped["tinygemm"]
        notes = {v.name: v.note for v in case.variants}
        assert "kernels aten_cpu" in notes["gptq4-g128-fused"] and "kernels turboquant_torch" in notes["tq4-g128-fused"]
        for variant in case.variants:
            assert variant.bytes > 0 and variant.flops > 0
            err = float(suite._QUALITY.search(variant.note).group(1))
            # The same weights computed in float: bf16 arithmetic's error, far below a
            # 4-bit quantizer's (0.15 on these weights; a mismatched reference shows it).
            assert 0 < err < 0.02, (case.label, variant.name, err)
            variant.fn(0)
    decode = cases[0]
    for variant in decode.variants:
        compiled = variant.fn.__self__  # type: ignore[attr-defined]
        eager = Decoder(compiled.model, batch=2, prompt=4, new_tokens=3, device="cpu", compile=False)
        assert compiled.tokens() == eager.tokens(), variant.name
    fused = suite._built["gptq4-g128-fused"]
    assert sum(type(m).__name__ == "FusedSlice" for m in fused.modules()) == 5 * 2


def test_the_reference_holds_the_quantized_weights_in_float(suite) -> None:
    from quantcore.benchmarks.decode import reference_copy
    from quantcore.nn.quant_module import QuantModule

    dense = suite.dense_model(_tiny(suite), "cpu")
    ref = reference_copy(dense, suite.TQ4, fuse=True)
    quantized = [m for m in ref.modules() if isinstance(m, QuantModule)]
    assert len(quantized) == 4 * 2 and all(m.kernel.name == "torch_fallback" for m in quantized)
    assert all(p.dtype == torch.float32 for p in ref.parameters())
    assert {b.dtype for m in quantized for b in m.buffers() if b.is_floating_point()} == {torch.float32}


def test_variant_names_come_from_the_environment(suite, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.errors import InvalidArgumentError

    monkeypatch.setenv(suite.VARIANTS_ENV, "tinygemm, gptq4-g128")
    assert suite.variant_names() == ["bf16", "tinygemm", "gptq4-g128"]
    monkeypatch.delenv(suite.VARIANTS_ENV)
    assert suite.variant_names() == list(suite.DEFAULT_VARIANTS)
    monkeypatch.setenv(suite.VARIANTS_ENV, "bf16,int3")
    with pytest.raises(InvalidArgumentError, match=r"QUANTCORE_DECODE_VARIANTS: expected names from .*got \['int3'\]"):
        suite.variant_names()


def _row(case: str, dims: dict[str, int], variant: str, time_s: float, peers: dict[str, float], copy: float,
         err: float) -> dict[str, object]:
    role = "peer" if variant in ("bf16", "tinygemm") else "kernel"
    return {"case": case, "variant": variant, "role": role, "dims": dims, "time_s": time_s, "copy_share": copy,
            "matmul_share": 0.5, "speedup_vs": {p: t / time_s for p, t in peers.items() if p != variant},
            "note": f"kernels x; logits vs float reference: rel. error {err:.4f}, top-1 agree 100%"}


def test_the_summary_tells_speed_quality_and_every_target(suite) -> None:
    dims = {**suite.SHAPES["b1"][0]}
    peers = {"bf16": 1.0, "tinygemm": 0.5}
    rows = [_row("B1", dims, "bf16", 1.0, peers, 0.7, 0.003), _row("B1", dims, "tinygemm", 0.5, peers, 0.5, 0.004),
            _row("B1", dims, "gptq4-g128-fused", 0.4, peers, 0.65, 0.005),
            {"case": "B1", "variant": "tq4-g128-fused", "role": "skipped", "dims": dims, "note": "not here"}]
    notes = suite.summarize(rows)
    assert notes[0].startswith("B1: bf16 128.0 tok/s, 0.50× tinygemm, 70% of copy BW, logits rel. error 0.0030; ")
    assert "gptq4-g128-fused 320.0 tok/s, 2.50× bf16, 1.25× tinygemm, 65% of copy BW, logits rel. error 0.0050" in notes[0]
    assert "B1: target gptq4-g128-fused ≥ 2.10×: 2.50× bf16 — met" in notes
    assert "B1: target gptq4-g128-fused ≥ 60%: 65% of copy BW — met" in notes
    assert "B1: target gptq4-g128-fused ≥ 1.15×: 1.25× tinygemm — met" in notes
    assert "B1: target tq4-g128-fused x_bf16 ≥ 1.90: not measured in this run" in notes
    slow = [_row("P", {**suite.SHAPES["prefill"][0]}, "bf16", 1.0, {"bf16": 1.0}, 0.1, 0.002),
            _row("P", {**suite.SHAPES["prefill"][0]}, "gptq4-g128-fused", 1.1, {"bf16": 1.0}, 0.1, 0.004)]
    notes = suite.summarize(slow)
    assert "gptq4-g128-fused 1100.0 ms to first token, 0.91× bf16, 50% of matmul" in notes[0]
    assert "P: target gptq4-g128-fused ≥ 0.95×: 0.91× bf16 — MISSED" in notes
    small = [_row("S", {**suite.SHAPES["layers8"][0]}, "bf16", 1.0, {"bf16": 1.0}, 0.1, 0.002)]
    assert len(suite.summarize(small)) == 1  # targets are the 32-layer model's


# --- the per-part profile (its attribution on synthetic events: tests/nn/test_decode_profile.py) ---


@pytest.mark.parametrize("eager", [False, True], ids=["compiled", "eager"])
def test_the_profile_splits_a_step_into_its_parts(suite, eager: bool) -> None:
    from quantcore.benchmarks.decode_profile import profile_case

    dims = _tiny(suite, C=0 if eager else 1)
    result = profile_case(dims, "cpu", ["bf16", "gptq4-g128-fused"], steps=2)
    assert result["case"] == ("B1-T8-L2-H128-eager" if eager else "B1-T8-L2-H128")
    for name, v in result["variants"].items():
        parts = v["parts_ms_per_step"]
        for part in ("linears", "attention", "norms", "lm_head", "embedding"):
            assert parts.get(part, 0) > 0, (name, part, parts)
        assert parts["host"] >= 0 and sum(parts.values()) == pytest.approx(v["wall_ms_per_step"], rel=0.02)
    assert result["variants"]["gptq4-g128-fused"]["kernels"] == "aten_cpu"

