"""End-to-end decode: a Llama-architecture model with Llama-3.1-8B's layer shapes (hidden
4096, intermediate 14336, 32 heads, 8 KV heads, vocabulary 128256; random weights),
dense bf16 beside the same model quantized to GPTQ 4-bit g128 and to TurboQuant 4-bit
g128 with ``quantcore.quantize_``, each generating ``T`` tokens greedily for a batch of
``B`` after a ``P``-token prompt, one ``torch.compile`` step per token (inductor; see
:mod:`quantcore.benchmarks.decode`). With ``--graph`` a whole generation is captured as one
CUDA graph and replayed, as an engine replays its decode graphs.

A variant's time is one whole generation of T tokens; tokens/s = B·T / time. Its bytes
are every weight and buffer of the model once per step (the floor a decode step must
read) times T, so "share of copy BW" says how close a generation comes to streaming its
weights at the measured copy bandwidth. The GPTQ and TurboQuant rows name the kernel
``get_kernel`` picked for their layers. The embedding and the LM head stay bf16 in every
variant, as quantized checkpoints ship them: at batch 1 the LM head alone is 1.05 GB of
the 4-bit model's ~5.3 GB per step, which caps the speed-up over bf16 (~15.1 GB) near 2.9×.

Shape sets: ``default`` (32 layers, B = 1 and 16), ``layers8`` (the same with 8 layers,
for a shorter run), ``tiny`` (a toy config that runs in CI on the CPU, where the step is
compiled with the ``aot_eager`` backend: full graph, fake implementations, no C++ build).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import torch

from quantcore.formats.gptq import GPTQ
from quantcore.formats.turboquant import TurboQuant
from quantcore.nn.quant_module import QuantModule

from ..decode import LLAMA_3_1_8B, Decoder, model_bytes, quantized_copy, random_llama
from ..spec import BenchCase, Variant

#: ``--graph`` captures one whole generation (T compiled steps) per replay.
GRAPH_CALLS = 1
DESCRIPTION = "Llama-3.1-8B-shaped decode, bf16 vs GPTQ-4 g128 vs TurboQuant-4: tokens/s with torch.compile + CUDA graphs"

_8B = {**LLAMA_3_1_8B, "P": 16, "T": 128}
_TINY = {"H": 128, "I": 256, "NH": 4, "NKV": 2, "V": 256, "L": 2, "P": 4, "T": 8}
SHAPES = {
    "default": [{**_8B, "L": 32, "B": b} for b in (1, 16)],
    "layers8": [{**_8B, "L": 8, "B": b} for b in (1, 16)],
    "tiny": [{**_TINY, "B": b} for b in (1, 2)],
}
FORMATS = {"gptq4-g128": GPTQ(bits=4, group_size=128, sym=True), "tq4-g128": TurboQuant(bits=4, group_size=128)}
DTYPE = torch.bfloat16

#: The models of the last config, reused across batch sizes: {variant: model}.
_models: dict[str, Any] = {"key": None, "models": {}}


def models(dims: dict[str, int], device: str) -> dict[str, torch.nn.Module]:
    key = tuple(sorted((k, v) for k, v in dims.items() if k not in ("B", "T", "P")))
    if _models["key"] != key:
        _models["models"] = {}
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        dense = random_llama(dims, device, DTYPE)
        built = {"bf16": dense}
        for name, fmt in FORMATS.items():
            built[name] = quantized_copy(dense, fmt, DTYPE)
        _models.update(key=key, models=built)
    return _models["models"]  # type: ignore[no-any-return]


def kernels_of(model: torch.nn.Module) -> str:
    names = sorted({m.kernel.name for m in model.modules() if isinstance(m, QuantModule) and m.kernel is not None})
    return "/".join(names)


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    if not device.startswith("cuda") and any(d["H"] * d["L"] > 4096 for d in shapes):
        raise SystemExit("model_decode: an 8B-shaped model is a GPU run; on the CPU use --shapes tiny")
    for dims in shapes:
        b, t, p = dims["B"], dims["T"], dims["P"]
        label = f"B{b}-T{t}-L{dims['L']}-H{dims['H']}"
        case = BenchCase("model_decode", label, dict(dims))
        built = models(dims, device)
        dense_params = sum(p.numel() for p in built["bf16"].parameters())
        reference = None
        for name, model in built.items():
            decoder = Decoder(model, batch=b, prompt=p, new_tokens=t, device=device)
            compile_s = decoder.warm_up()
            nbytes = model_bytes(model) * t
            note = f"compile+capture {compile_s:.1f} s; {model_bytes(model) / 1e9:.2f} GB of weights"
            if name == "bf16":
                reference = decoder.prefill_logits
            else:
                assert reference is not None
                err = ((decoder.prefill_logits - reference).norm() / reference.norm()).item()
                note += f"; kernels {kernels_of(model)}; prefill logits vs bf16: rel. error {err:.3f}"
            case.variants.append(Variant(name, "peer" if name == "bf16" else "kernel", decoder.generate,
                                         nbytes, 2 * dense_params * b * t, note=note))
        yield case


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    notes = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["case"] == case and r["role"] != "skipped"}
        if "bf16" not in mine:
            continue
        dims = mine["bf16"]["dims"]
        per_gen = dims["B"] * dims["T"]
        parts = [f"bf16 {per_gen / mine['bf16']['time_s']:.1f} tok/s"]
        for name in FORMATS:
            if name in mine:
                r = mine[name]
                ratio = mine["bf16"]["time_s"] / r["time_s"]
                goal = " (goal at B=1 for GPTQ: ≥ 2.5×)" if name.startswith("gptq") and dims["B"] == 1 else ""
                parts.append(f"{name} {per_gen / r['time_s']:.1f} tok/s = {ratio:.2f}× bf16{goal}, "
                             f"{100 * r['copy_share']:.0f}% of copy BW")
        notes.append(f"{case}: " + "; ".join(parts))
    return notes
