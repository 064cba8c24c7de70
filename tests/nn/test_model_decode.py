"""The model_decode bench suite on the CPU with a toy config: its cases build, compile
with fullgraph (the ``aot_eager`` backend here), decode exactly what the eager model does,
name the kernels, and summarize. No timing: the numbers are the GPU run's."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")


def test_model_decode_runs_small_on_the_cpu() -> None:
    from quantcore.benchmarks.decode import Decoder
    from quantcore.benchmarks.suites import model_decode

    shape = {**model_decode.SHAPES["tiny"][1], "T": 4}
    (case,) = list(model_decode.cases("cpu", [shape]))
    assert [v.name for v in case.variants] == ["bf16", "gptq4-g128", "tq4-g128"]
    notes = {v.name: v.note for v in case.variants}
    assert "kernels aten_cpu" in notes["gptq4-g128"] and "kernels turboquant_torch" in notes["tq4-g128"]
    for variant in case.variants:
        compiled = variant.fn.__self__  # type: ignore[attr-defined]
        eager = Decoder(compiled.model, batch=shape["B"], prompt=shape["P"], new_tokens=shape["T"], device="cpu",
                        compile=False)
        assert compiled.tokens() == eager.tokens(), variant.name
        assert variant.bytes > 0 and variant.flops > 0
    rows = [{"case": case.label, "variant": v.name, "role": v.role, "dims": case.dims, "time_s": t,
             "copy_share": 0.5} for v, t in zip(case.variants, (2.0, 1.0, 0.5), strict=True)]
    (line,) = model_decode.summarize(rows)
    assert "gptq4-g128 8.0 tok/s = 2.00× bf16" in line and "tq4-g128 16.0 tok/s = 4.00× bf16" in line
