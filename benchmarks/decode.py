"""End-to-end decode of a Llama-architecture model (transformers), dense or quantized with
``quantcore.quantize_``, stepped by one compiled function over a static KV cache.

Used by the ``model_decode`` suite. The model is built from a config (random weights:
decode speed does not depend on their values); a :class:`Decoder` prefills a random
prompt eagerly, then each :meth:`Decoder.step` runs one token for the whole batch through
``torch.compile(fullgraph=True)`` and feeds the greedy token back. ``generate`` is
``new_tokens`` steps; on CUDA the bench captures a whole generation as one CUDA graph.
"""

from __future__ import annotations

import copy
import inspect
import os
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

import quantcore
from quantcore.formats.base import Format

__all__ = ["LLAMA_3_1_8B", "Decoder", "llama_config", "model_bytes", "quantized_copy", "random_llama"]

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
    directly on ``device``."""
    import transformers

    config = llama_config(dims)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)


def quantized_copy(model: nn.Module, fmt: Format, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """A copy of ``model`` with every decoder linear quantized to ``fmt`` (the embedding
    and the LM head stay in ``dtype``, as quantized checkpoints ship them)."""
    quant = copy.deepcopy(model)
    quantcore.quantize_(quant, fmt, filter_fn=lambda m, name: name != "lm_head", dtype=dtype)
    return quant


def model_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer: what one decode step reads at least."""
    seen: dict[int, int] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def compile_options(device: str) -> dict[str, Any]:
    """CUDA: inductor, one graph per step; the CUDA graph is the bench's (``--graph``: a
    whole generation captured once), not cudagraph trees', which refuse the tensors
    transformers' static cache keeps between steps. CPU: ``QUANTCORE_DECODE_BACKEND``
    (default ``aot_eager``: the full graph and every fake implementation, without
    inductor's C++ build, which CI cannot afford on two cores)."""
    if device.startswith("cuda"):
        return {"fullgraph": True}
    return {"backend": os.environ.get("QUANTCORE_DECODE_BACKEND", "aot_eager"), "fullgraph": True}


class Decoder:
    """Greedy decode of ``batch`` sequences: a random ``prompt``-token prefill, then
    ``new_tokens`` compiled steps per :meth:`generate`."""

    def __init__(self, model: nn.Module, *, batch: int, prompt: int, new_tokens: int, device: str,
                 compile: bool = True, seed: int = 0) -> None:
        from transformers import StaticCache

        self.model, self.batch, self.prompt, self.new_tokens = model, batch, prompt, new_tokens
        dev = torch.device(device)
        kwargs: dict[str, Any] = {"config": model.config, "max_cache_len": prompt + new_tokens}
        params = inspect.signature(StaticCache.__init__).parameters
        if "max_batch_size" in params:  # transformers 4.x allocates up front
            kwargs.update(max_batch_size=batch, device=dev, dtype=next(model.parameters()).dtype)
        self.cache = StaticCache(**kwargs)
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=gen).to(dev)
        with torch.no_grad():
            out = model(input_ids=ids, past_key_values=self.cache, cache_position=torch.arange(prompt, device=dev),
                        use_cache=True)
        #: The prefill's logits of the last prompt position (for comparing models).
        self.prefill_logits = out.logits[:, -1].float()
        self.first_token = out.logits[:, -1:].argmax(-1).clone()
        self.token = self.first_token.clone()
        self.positions = [torch.tensor([prompt + t], device=dev) for t in range(new_tokens)]
        self.compile_s = 0.0
        self._step = torch.compile(self._forward, **compile_options(device)) if compile else self._forward

    def _forward(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        # Both spellings of the position: transformers 4.x / early 5.x write the cache at
        # cache_position; later 5.x keep their own count (rewound in generate) and take
        # position_ids for the rotary embedding.
        out = self.model(input_ids=token, past_key_values=self.cache, cache_position=position,
                         position_ids=position.view(1, 1).expand(token.shape[0], 1), use_cache=True)
        return out.logits[:, -1:].argmax(-1)

    def _rewind(self) -> None:
        """Back to the end of the prompt, for caches that count their own length."""
        for layer in getattr(self.cache, "layers", ()):
            length = getattr(layer, "cumulative_length", None)
            if isinstance(length, torch.Tensor):
                length.fill_(self.prompt)
            elif isinstance(length, int):
                layer.cumulative_length = self.prompt

    def step(self, i: int) -> torch.Tensor:
        """Decode the token at position ``prompt + i`` (the previous ``i`` done) and feed it back."""
        with torch.no_grad():
            nxt = self._step(self.token, self.positions[i])
            self.token.copy_(nxt)  # a CUDA graph's output is overwritten by its next replay
        return self.token

    def generate(self, _: int = 0) -> torch.Tensor:
        """``new_tokens`` greedy steps after the prompt (the same prompt every time)."""
        self._rewind()
        self.token.copy_(self.first_token)
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
        self._rewind()
        self.token.copy_(self.first_token)
        return [self.step(i).flatten().tolist() for i in range(self.new_tokens)]
