"""End to end: a Llama-architecture model with Llama-3.1-8B's layer shapes (hidden 4096,
intermediate 14336, 32 heads, 8 KV heads, vocabulary 128256, 32 layers; random weights),
dense bf16 beside the same model quantized with ``quantcore.quantize_``, generating in one
harness (:mod:`quantcore.benchmarks.decode`). Attention is the same in every variant: a
decode step packs the grouped query heads onto their KV head and reads the cache once (no
K/V repeat), as engines' decode attention does (:mod:`quantcore.benchmarks.grouped_attention`);
prefill is transformers' sdpa.

Variants (``QUANTCORE_DECODE_VARIANTS=a,b,…`` picks some, in that order):

``bf16``              the dense model (peer).
``gptq4-g128``        GPTQ 4-bit g128, each linear bound to the kernel ``get_kernel`` picks.
``gptq4-g128-fused``  the same weights with q/k/v and gate/up fused (``fuse=True``).
``tq4-g128-fused``    TurboQuant 4-bit g128, fused (``tq4-g128``: unfused, not run by default).
``…-fused-graphed``   ``gptq4-g128-fused`` or ``tq4-g128-fused`` with every decoder layer's
                      MLP replayed from a CUDA graph in eager calls of up to 16 rows
                      (``quantcore.nn.graphed.graph_submodules``; not run by default: it
                      changes only the ``eager`` set, as a compiled step runs the MLPs itself).
``tinygemm``          the GPTQ weights with every layer forced to ``aten_cuda`` — torch's
                      ``_weight_int4pack_mm`` (tinygemm), what torchao's int4 weight-only
                      runs — unfused, as torchao leaves the projections (peer; CUDA only).

Shape sets, each sized for one GPU call of under ten minutes:

``b1``, ``b16``, ``b64``  decode at batch 1, 16, 64: a 16-token prompt, then 128 greedy
                      tokens, one ``torch.compile(fullgraph=True)`` step per token; with
                      ``--graph`` a whole generation is one CUDA graph, replayed.
``prefill``           time to first token: a 2048-token prompt at batch 1 through the
                      compiled model into the static cache (``T = 0``).
``eager``             decode at batch 1 without ``torch.compile`` (``C = 0``), the way
                      transformers' ``generate`` runs by default (32 tokens; run it
                      without ``--graph``: the host's launch cost is what it measures).
``default``           ``b1``. ``layers8``: 8 layers, batch 1 and 16, for a shorter run.
``tiny``              a toy config on the CPU, every kind of case (CI runs it, with the
                      ``aot_eager`` backend; it records times and asserts none).

A decode row's time is one whole generation; tokens/s = B·T / time. Its bytes are what
each step reads at least — every weight and buffer of the model plus the static KV cache
(read whole by attention at static shapes) — times T, so "share of copy BW" says how close
a generation comes to streaming them at the measured copy bandwidth. A prefill row's time
is the time to first token; its share of matmul says how close it comes to the bf16
matmul rate. The embedding and the LM head stay bf16 in every variant, as quantized
checkpoints ship them: at batch 1 the LM head's 1.05 GB caps a 4-bit model's speed-up
over bf16 near 2.9×.

Quality beside speed: each row's note gives the error of its logits against the same
model computed in float (:func:`~quantcore.benchmarks.decode.reference_copy`: float32,
each quantized layer dequantized by the golden dequantizer — the same weights, so the
error is the kernels' and bf16 arithmetic's, not the quantizer's), at the position the
timed path computes: the first decode step (M = B rows) or the prompt's last position.
The bf16 row's error is that of bf16 arithmetic alone.

Where a target of the 32-layer model is missed, :mod:`quantcore.benchmarks.decode_profile`
says which part of a step holds it back (linears, attention, norms, LM head, launch gaps);
``tools/probes/model_decode_gpu.sh`` runs either on a CUDA machine, one shape set per call.
"""

from __future__ import annotations

import gc
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quantcore.errors import InvalidArgumentError
from quantcore.formats.base import Format
from quantcore.formats.gptq import GPTQ
from quantcore.formats.turboquant import TurboQuant
from quantcore.nn.graphed import graph_submodules
from quantcore.nn.quant_module import QuantModule

from ..decode import (
    LLAMA_3_1_8B,
    Decoder,
    Prefill,
    logits_error,
    model_bytes,
    prompt_ids,
    quantized_copy,
    random_llama,
    reference_copy,
)
from ..spec import BenchCase, Role, Variant

#: ``--graph`` captures one whole generation (T compiled steps) or one prefill per replay.
GRAPH_CALLS = 1
DESCRIPTION = ("Llama-3.1-8B-shaped generation: bf16 vs GPTQ-4 (fused, unfused) vs TurboQuant-4 vs tinygemm; "
               "tokens/s, time to first token, logits vs the float reference")

_8B = {**LLAMA_3_1_8B, "L": 32, "P": 16, "T": 128, "C": 1}
_TINY = {"H": 128, "I": 256, "NH": 4, "NKV": 2, "V": 256, "L": 2, "P": 4, "T": 8, "C": 1}
SHAPES: dict[str, list[dict[str, int]]] = {
    "b1": [{**_8B, "B": 1}],
    "b16": [{**_8B, "B": 16}],
    "b64": [{**_8B, "B": 64}],
    "prefill": [{**_8B, "B": 1, "P": 2048, "T": 0}],
    "eager": [{**_8B, "B": 1, "T": 32, "C": 0}],
    "layers8": [{**_8B, "L": 8, "B": b} for b in (1, 16)],
    "tiny": [{**_TINY, "B": 1}, {**_TINY, "B": 2}, {**_TINY, "B": 1, "P": 16, "T": 0}, {**_TINY, "B": 1, "C": 0}],
}
SHAPES["default"] = SHAPES["b1"]
DTYPE = torch.bfloat16
VARIANTS_ENV = "QUANTCORE_DECODE_VARIANTS"


@dataclass(frozen=True)
class Recipe:
    """How a variant's model is made from the dense one."""

    fmt: Format | None = None
    fuse: bool = False
    prefer: str | None = None
    role: Role = "kernel"
    #: The device type it needs, when it cannot run elsewhere (with why).
    needs: tuple[str, str] | None = None
    #: Eager calls of every decoder layer's MLP replayed from CUDA graphs.
    graph_mlps: bool = False

    @property
    def reference(self) -> tuple[Format | None, bool]:
        """The float reference it is judged against: its format, and whether fusing
        changed its tensors (a quantizer that draws at random draws once per group)."""
        draws = isinstance(self.fmt, TurboQuant) or (isinstance(self.fmt, GPTQ) and self.fmt.uses_act_order)
        return self.fmt, self.fuse and draws


GPTQ4 = GPTQ(bits=4, group_size=128, sym=True)
TQ4 = TurboQuant(bits=4, group_size=128)
RECIPES: dict[str, Recipe] = {
    "bf16": Recipe(role="peer"),
    "gptq4-g128": Recipe(GPTQ4),
    "gptq4-g128-fused": Recipe(GPTQ4, fuse=True),
    "tq4-g128": Recipe(TQ4),
    "tq4-g128-fused": Recipe(TQ4, fuse=True),
    "gptq4-g128-fused-graphed": Recipe(GPTQ4, fuse=True, graph_mlps=True),
    "tq4-g128-fused-graphed": Recipe(TQ4, fuse=True, graph_mlps=True),
    "tinygemm": Recipe(GPTQ4, prefer="aten_cuda", role="peer",
                       needs=("cuda", "aten_cuda (tinygemm, torch's _weight_int4pack_mm) runs on CUDA only")),
}
DEFAULT_VARIANTS = ("bf16", "gptq4-g128", "gptq4-g128-fused", "tq4-g128-fused", "tinygemm")

#: Goals of the 32-layer model (B, kind) → [(variant, what, bound)]; "x_bf16" and
#: "x_tinygemm" are speed-ups (time ratios), "copy" the share of copy bandwidth.
TARGETS: dict[tuple[int, str], list[tuple[str, str, float]]] = {
    (1, "decode"): [("gptq4-g128-fused", "x_bf16", 2.1), ("gptq4-g128-fused", "copy", 0.60),
                    ("gptq4-g128-fused", "x_tinygemm", 1.15), ("tq4-g128-fused", "x_bf16", 1.9)],
    (16, "decode"): [("gptq4-g128-fused", "x_bf16", 1.9), ("gptq4-g128-fused", "x_tinygemm", 2.0),
                     ("tq4-g128-fused", "x_bf16", 1.5)],
    (64, "decode"): [("gptq4-g128-fused", "x_bf16", 1.4)],
    (1, "prefill"): [("gptq4-g128-fused", "x_bf16", 1 / 1.05)],
    (1, "eager"): [("gptq4-g128-fused", "x_bf16", 1.0)],
}


def variant_names() -> list[str]:
    """The variants to run: ``QUANTCORE_DECODE_VARIANTS`` (comma-separated) or the default
    set; ``bf16`` always first, every ratio is against it."""
    text = os.environ.get(VARIANTS_ENV, "")
    names = [n.strip() for n in text.split(",") if n.strip()] or list(DEFAULT_VARIANTS)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise InvalidArgumentError(f"{VARIANTS_ENV}: expected names from {list(RECIPES)}, got {unknown}")
    return ["bf16", *[n for n in dict.fromkeys(names) if n != "bf16"]]


def kind(dims: dict[str, int]) -> str:
    return "prefill" if dims["T"] == 0 else "decode" if dims.get("C", 1) else "eager"


def label(dims: dict[str, int]) -> str:
    shape = f"L{dims['L']}-H{dims['H']}"
    if kind(dims) == "prefill":
        return f"prefill-B{dims['B']}-P{dims['P']}-{shape}"
    return f"B{dims['B']}-T{dims['T']}-{shape}" + ("-eager" if kind(dims) == "eager" else "")


# --- models -------------------------------------------------------------------------------------

#: The models of the last config, reused across its cases: {"key": config, "dense": …, name: model}.
_built: dict[str, Any] = {"key": None}


def _free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def dense_model(dims: dict[str, int], device: str) -> torch.nn.Module:
    key = tuple(sorted((k, v) for k, v in dims.items() if k not in ("B", "T", "P", "C")))
    if _built.get("key") != key:
        _built.clear()
        _free(device)
        _built.update(key=key, dense=random_llama(dims, device, DTYPE))
    return _built["dense"]  # type: ignore[no-any-return]


def variant_model(name: str, dims: dict[str, int], device: str) -> torch.nn.Module:
    dense = dense_model(dims, device)
    if name not in _built:
        recipe = RECIPES[name]
        _built[name] = dense if recipe.fmt is None else quantized_copy(dense, recipe.fmt, DTYPE, fuse=recipe.fuse,
                                                                       prefer=recipe.prefer)
        if recipe.graph_mlps:
            graph_submodules(_built[name], ("mlp",), max_rows=16)
    return _built[name]  # type: ignore[no-any-return]


def kernels_of(model: torch.nn.Module) -> str:
    names = sorted({m.kernel.name for m in model.modules() if isinstance(m, QuantModule) and m.kernel is not None})
    return "/".join(names)


def _linear_params(model: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def _cache_bytes(dims: dict[str, int]) -> int:
    """The static KV cache a decode step's attention reads: K and V of every layer."""
    head = dims["H"] // dims["NH"]
    return dims["B"] * dims["NKV"] * (dims["P"] + dims["T"]) * head * 2 * DTYPE.itemsize * dims["L"]


def reference_logits(dims: dict[str, int], device: str, names: Sequence[str]) -> dict[tuple[Any, bool], torch.Tensor]:
    """Each distinct float reference's logits at the position the case times: after the
    prompt and one fixed token (decode), or at the prompt's end (prefill). Built one at a
    time before any quantized variant, so a float32 copy of the model fits beside the
    dense one."""
    dense = dense_model(dims, device)
    ids = prompt_ids(dims["V"], dims["B"], dims["P"], device)
    if kind(dims) != "prefill":
        ids = torch.cat([ids, _probe_token(dims, device)], dim=1)
    out: dict[tuple[Any, bool], torch.Tensor] = {}
    for key in dict.fromkeys(RECIPES[n].reference for n in names):
        fmt, fuse = key
        ref = reference_copy(dense, fmt, fuse=fuse)
        with torch.no_grad():
            out[key] = ref(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1].float()
        del ref
        _free(device)
    return out


def _probe_token(dims: dict[str, int], device: str) -> torch.Tensor:
    """The token every variant's first decode step reads when its logits are judged."""
    return prompt_ids(dims["V"], dims["B"], 1, device, seed=1)


# --- cases --------------------------------------------------------------------------------------


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    if not device.startswith("cuda") and any(d["H"] * d["L"] > 4096 for d in shapes):
        raise SystemExit("model_decode: an 8B-shaped model is a GPU run; on the CPU use --shapes tiny")
    names = variant_names()
    for dims in shapes:
        case = BenchCase("model_decode", label(dims), dict(dims))
        runnable = []
        for name in names:
            needs = RECIPES[name].needs
            if needs is not None and not device.startswith(needs[0]):
                case.skipped[name] = needs[1]
            else:
                runnable.append(name)
        refs = reference_logits(dims, device, runnable)
        tokens = dims["P"] if kind(dims) == "prefill" else dims["T"]
        flops = 2 * _linear_params(dense_model(dims, device)) * dims["B"] * tokens
        for name in runnable:
            recipe = RECIPES[name]
            model = variant_model(name, dims, device)
            if kind(dims) == "prefill":
                prefill = Prefill(model, batch=dims["B"], prompt=dims["P"], device=device)
                logits, fn, warm_up = prefill.logits, prefill.first_token, prefill.warm_up
                nbytes = model_bytes(model)
            else:
                decoder = Decoder(model, batch=dims["B"], prompt=dims["P"], new_tokens=dims["T"], device=device,
                                  compile=kind(dims) == "decode")
                logits, fn, warm_up = decoder.step_logits(_probe_token(dims, device)), decoder.generate, decoder.warm_up
                nbytes = (model_bytes(model) + _cache_bytes(dims)) * dims["T"]
            seconds = warm_up()
            quality = logits_error(logits, refs[recipe.reference])
            note = [f"{'compile+first run' if dims.get('C', 1) else 'first run'} {seconds:.1f} s",
                    f"{model_bytes(model) / 1e9:.2f} GB of weights"]
            if recipe.fmt is not None:
                note.append(f"kernels {kernels_of(model)}")
            note.append(f"logits vs float reference: rel. error {quality['rel_error']:.4f}, "
                        f"top-1 agree {100 * quality['top1_agree']:.0f}%")
            case.variants.append(Variant(name, recipe.role, fn, nbytes, flops, note="; ".join(note)))
            # A GPU call has a time limit: say how far it got before the timing starts.
            print(f"model_decode {case.label}: {name} ready ({note[0]})", file=sys.stderr, flush=True)
        yield case


# --- the story ----------------------------------------------------------------------------------

_QUALITY = re.compile(r"rel\. error ([0-9.]+)")


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    """Per case: each variant's tokens/s (prefill: time to first token), × bf16, ×
    tinygemm, share of copy bandwidth and logits error; then, for the 32-layer model,
    every target of the 32-layer model met or missed."""
    notes = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["case"] == case and r["role"] != "skipped"}
        if "bf16" not in mine:
            continue
        dims = mine["bf16"]["dims"]
        what = kind(dims)
        parts = []
        for name, r in mine.items():
            speed = (f"{1e3 * r['time_s']:.1f} ms to first token" if what == "prefill"
                     else f"{dims['B'] * dims['T'] / r['time_s']:.1f} tok/s")
            ratios = [f"{r['speedup_vs'][p]:.2f}× {p}" for p in ("bf16", "tinygemm") if p in r["speedup_vs"]]
            share = f"{100 * r['matmul_share']:.0f}% of matmul" if what == "prefill" else \
                f"{100 * r['copy_share']:.0f}% of copy BW"
            found = _QUALITY.search(r.get("note", ""))
            quality = [f"logits rel. error {found.group(1)}"] if found else []
            parts.append(f"{name} {', '.join([speed, *ratios, share, *quality])}")
        notes.append(f"{case}: " + "; ".join(parts))
        if (dims["L"], dims["H"]) == (32, 4096):
            notes += _targets(case, dims, mine, what)
    return notes


def _targets(case: str, dims: dict[str, int], mine: dict[str, dict[str, Any]], what: str) -> list[str]:
    out = []
    for name, metric, bound in TARGETS.get((dims["B"], what), []):
        r = mine.get(name)
        peer = metric.removeprefix("x_")
        if r is None or (metric != "copy" and peer not in r["speedup_vs"]):
            out.append(f"{case}: target {name} {metric} ≥ {bound:.2f}: not measured in this run")
            continue
        got = r["copy_share"] if metric == "copy" else r["speedup_vs"][peer]
        shown = f"{100 * got:.0f}% of copy BW" if metric == "copy" else f"{got:.2f}× {peer}"
        goal = f"{100 * bound:.0f}%" if metric == "copy" else f"{bound:.2f}×"
        out.append(f"{case}: target {name} ≥ {goal}: {shown} — {'met' if got >= bound else 'MISSED'}")
    return out
