"""End-to-end generation with a Llama-architecture model (transformers), dense or quantized
with ``quantcore.quantize_``, over a static KV cache.

Used by the ``model_decode`` suite. The model is built from a config (random weights:
speed does not depend on their values). A :class:`Decoder` prefills a random prompt
eagerly, then each :meth:`Decoder.step` runs one token for the whole batch — through
``torch.compile(fullgraph=True)``, or eagerly as transformers' ``generate`` does by default
— and feeds the greedy token back; ``generate`` is ``new_tokens`` steps (on CUDA the bench
captures a whole generation as one CUDA graph). A :class:`Prefill` runs the whole prompt
at once: the time to the first token.

Quality is judged against the same model computed in float: :func:`reference_copy` is the
model in float32 with every quantized layer replaced by its golden dequantization (the
``torch_fallback`` kernel: dequantize in float64, then a float32 matmul), built by the same
``quantize_`` call, so its weights are the quantized model's bit for bit; :func:`logits_error`
compares the logits of one position (the decode step's, or the prompt's last).
"""

from __future__ import annotations

import copy
import inspect
import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

import quantcore
from quantcore.errors import QuantCoreWarning
from quantcore.formats.base import Format

from . import grouped_attention

__all__ = [
    "LLAMA_3_1_8B",
    "Decoder",
    "Prefill",
    "llama_config",
    "logits_error",
    "model_bytes",
    "prompt_ids",
    "quantized_copy",
    "random_llama",
    "reference_copy",
]

#: Llama-3.1-8B's layer shapes (the number of layers is the caller's).
LLAMA_3_1_8B = {"H": 4096, "I": 14336, "NH": 32, "NKV": 8, "V": 128256}


def llama_config(dims: Mapping[str, int]) -> Any:
    import transformers

    return transformers.LlamaConfig(
        hidden_size=dims["H"], intermediate_size=dims["I"], num_attention_heads=dims["NH"],
        num_key_value_heads=dims["NKV"], num_hidden_layers=dims["L"], vocab_size=dims["V"],
        max_position_embeddings=max(8192, dims["P"] + dims["T"]), rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )


def random_llama(dims: Mapping[str, int], device: str, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """``LlamaForCausalLM`` with random weights (transformers' own init), built in ``dtype``
    directly on ``device``, its attention :mod:`~quantcore.benchmarks.grouped_attention`'s
    (a decode step reads each KV head once). The config carries that choice, so every copy
    made from the model (:func:`quantized_copy`, :func:`reference_copy`) attends alike."""
    import transformers

    config = llama_config(dims)
    config._attn_implementation = grouped_attention.register()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)


def _not_head(m: nn.Module, name: str) -> bool:
    return name != "lm_head"


def quantized_copy(
    model: nn.Module, fmt: Format, dtype: torch.dtype = torch.bfloat16, *, fuse: bool = False,
    prefer: str | tuple[str, ...] | None = None,
) -> nn.Module:
    """A copy of ``model`` with every decoder linear quantized to ``fmt`` (the embedding
    and the LM head stay in ``dtype``, as quantized checkpoints ship them); ``fuse`` fuses
    q/k/v and gate/up, ``prefer`` names the kernels to try first."""
    quant = copy.deepcopy(model)
    quantcore.quantize_(quant, fmt, filter_fn=_not_head, dtype=dtype, fuse=fuse, prefer=prefer)
    return quant


def reference_copy(model: nn.Module, fmt: Format | None = None, *, fuse: bool = False) -> nn.Module:
    """``model`` in float32 — quantized like :func:`quantized_copy` (same ``quantize_``
    call, so the same tensors) with every quantized layer on ``torch_fallback`` in float32,
    when ``fmt`` is given: the float dequantize-then-matmul reference."""
    ref = copy.deepcopy(model).float()
    if fmt is not None:
        with warnings.catch_warnings():  # the dense copies are the point here: no warning about them
            warnings.simplefilter("ignore", QuantCoreWarning)
            quantcore.quantize_(ref, fmt, filter_fn=_not_head, dtype=torch.float32, fuse=fuse,
                                prefer="torch_fallback")
    return ref


def model_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer: what one decode step reads at least."""
    seen: dict[int, int] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def prompt_ids(vocab: int, batch: int, prompt: int, device: str | torch.device, seed: int = 0) -> torch.Tensor:
    """The random prompt every variant of a case reads."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, prompt), generator=gen).to(device)


def logits_error(got: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """``got`` against ``ref`` (``[B, V]``): the relative L2 error over all rows and the
    share of rows whose greedy token agrees."""
    got, ref = got.float(), ref.float()
    return {"rel_error": ((got - ref).norm() / ref.norm()).item(),
            "top1_agree": (got.argmax(-1) == ref.argmax(-1)).float().mean().item()}


def compile_options(device: str) -> dict[str, Any]:
    """CUDA: inductor, one graph per step; the CUDA graph is the bench's (``--graph``: a
    whole generation captured once), not cudagraph trees', which refuse the tensors
    transformers' static cache keeps between steps. CPU: ``QUANTCORE_DECODE_BACKEND``
    (default ``aot_eager``: the full graph and every fake implementation, without
    inductor's C++ build, which CI cannot afford on two cores)."""
    if device.startswith("cuda"):
        return {"fullgraph": True}
    return {"backend": os.environ.get("QUANTCORE_DECODE_BACKEND", "aot_eager"), "fullgraph": True}


def _static_cache(model: nn.Module, batch: int, length: int, device: torch.device) -> Any:
    from transformers import StaticCache

    kwargs: dict[str, Any] = {"config": model.config, "max_cache_len": length}
    if "max_batch_size" in inspect.signature(StaticCache.__init__).parameters:  # transformers 4.x allocates up front
        kwargs.update(max_batch_size=batch, device=device, dtype=next(model.parameters()).dtype)
    return StaticCache(**kwargs)


def _with_cache(model: nn.Module, cache: Any) -> dict[str, Any]:
    """The cache argument under the name the model takes (``cache`` from transformers 5.x,
    ``past_key_values`` before)."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


def _rewind(cache: Any, length: int) -> None:
    """The cache back to ``length`` tokens, for caches that count their own length."""
    for layer in getattr(cache, "layers", ()):
        count = getattr(layer, "cumulative_length", None)
        if isinstance(count, torch.Tensor):
            count.fill_(length)
        elif isinstance(count, int):
            layer.cumulative_length = length


class Decoder:
    """Greedy decode of ``batch`` sequences: a random ``prompt``-token prefill, then
    ``new_tokens`` steps per :meth:`generate`, compiled unless ``compile=False``."""

    def __init__(self, model: nn.Module, *, batch: int, prompt: int, new_tokens: int, device: str,
                 compile: bool = True, seed: int = 0) -> None:
        self.model, self.batch, self.prompt, self.new_tokens = model, batch, prompt, new_tokens
        dev = torch.device(device)
        self.cache = _static_cache(model, batch, prompt + new_tokens, dev)
        self._cache_arg = _with_cache(model, self.cache)
        ids = prompt_ids(model.config.vocab_size, batch, prompt, dev, seed)
        with torch.no_grad():
            out = model(input_ids=ids, cache_position=torch.arange(prompt, device=dev), use_cache=True,
                        logits_to_keep=1, **self._cache_arg)
        #: The prefill's logits of the last prompt position (for comparing models).
        self.prefill_logits = out.logits[:, -1].float()
        self.first_token = out.logits[:, -1:].argmax(-1).clone()
        self.token = self.first_token.clone()
        self.positions = [torch.tensor([prompt + t], device=dev) for t in range(new_tokens)]
        self.compile_s = 0.0
        self._step = torch.compile(self._forward, **compile_options(device)) if compile else self._forward

    def _forward(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return self._logits(token, position).argmax(-1, keepdim=True)

    def _logits(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        # Both spellings of the position: transformers 4.x / early 5.x write the cache at
        # cache_position; later 5.x keep their own count (rewound in generate) and take
        # position_ids for the rotary embedding.
        out = self.model(input_ids=token, cache_position=position, position_ids=position.view(1, 1).expand(token.shape[0], 1),
                         use_cache=True, logits_to_keep=1, **self._cache_arg)
        return out.logits[:, -1]  # type: ignore[no-any-return]

    def step(self, i: int) -> torch.Tensor:
        """Decode the token at position ``prompt + i`` (the previous ``i`` done) and feed it back."""
        with torch.no_grad():
            nxt = self._step(self.token, self.positions[i])
            self.token.copy_(nxt)  # a CUDA graph's output is overwritten by its next replay
        return self.token

    def restart(self) -> None:
        """Back to the end of the prompt, its greedy token next."""
        _rewind(self.cache, self.prompt)
        self.token.copy_(self.first_token)

    def generate(self, _: int = 0) -> torch.Tensor:
        """``new_tokens`` greedy steps after the prompt (the same prompt every time)."""
        self.restart()
        for i in range(self.new_tokens):
            self.step(i)
        return self.token

    def warm_up(self) -> float:
        """Compile (and record the CUDA graphs) outside any timing; returns the seconds it took."""
        start = time.perf_counter()
        self.generate()
        if self.token.is_cuda:
            torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - start
        return self.compile_s

    def tokens(self) -> list[list[int]]:
        """The greedy tokens of one generation, step by step (batch rows in each)."""
        self.restart()
        return [self.step(i).flatten().tolist() for i in range(self.new_tokens)]

    def step_logits(self, token: torch.Tensor) -> torch.Tensor:
        """The logits of the first decode step (``M = batch`` rows, as every timed step),
        eagerly, for ``token`` ``[batch, 1]`` after the prompt."""
        _rewind(self.cache, self.prompt)
        with torch.no_grad():
            return self._logits(token, self.positions[0]).float()


class Prefill:
    """Time to first token: the whole ``prompt`` of ``batch`` sequences through the model
    at once into a static cache, compiled unless ``compile=False``; the greedy first token."""

    def __init__(self, model: nn.Module, *, batch: int, prompt: int, device: str, compile: bool = True,
                 seed: int = 0) -> None:
        self.model, self.batch, self.prompt = model, batch, prompt
        dev = torch.device(device)
        self.cache = _static_cache(model, batch, prompt, dev)
        self._cache_arg = _with_cache(model, self.cache)
        self.ids = prompt_ids(model.config.vocab_size, batch, prompt, dev, seed)
        self.positions = torch.arange(prompt, device=dev)
        with torch.no_grad():  # eagerly first: the cache allocates itself outside any compiled region
            #: The logits of the last prompt position (for comparing models).
            self.logits = self._forward(self.ids, self.positions).float()
        self.token = self.logits.argmax(-1, keepdim=True)
        self.compile_s = 0.0
        self._run = torch.compile(self._forward, **compile_options(device)) if compile else self._forward

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, cache_position=positions, use_cache=True, logits_to_keep=1,
                         **self._cache_arg)
        return out.logits[:, -1]  # type: ignore[no-any-return]

    def first_token(self, _: int = 0) -> torch.Tensor:
        """One prefill of the prompt (the cache rewound to empty); its greedy token."""
        _rewind(self.cache, 0)
        with torch.no_grad():
            self.token.copy_(self._run(self.ids, self.positions).argmax(-1, keepdim=True))
        return self.token

    def warm_up(self) -> float:
        start = time.perf_counter()
        self.first_token()
        if self.token.is_cuda:
            torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - start
        return self.compile_s
