"""A Llama-shaped quantized checkpoint folder of any size, written without ever holding
more than one decoder layer's tensors (for ``load_memory.py``).

Each quantized linear's tensors are drawn at random with the shapes and dtypes its format
stores (``quantcore/formats/``): packed codes are random int32 lanes, which at 4 bits is
exactly a packed stream of uniformly random codes (every nibble is a valid code), zero
points likewise (any 4-bit field is a zero point in range; GPTQ ``sym`` stores the one
zero point 8 through the format's own v1 rule), scales positive and finite. The dense
tensors (embeddings, norms, ``lm_head``) are bfloat16. Values are random: this measures
memory, not accuracy.

The folder has the layout :func:`quantcore.checkpoint.save_checkpoint` writes (the same
tensor names, ``model.safetensors`` alone or ``model-0000i-of-0000n.safetensors`` with a
``model.safetensors.index.json`` holding ``weight_map`` (and ``metadata.total_size``, which
transformers' ``from_pretrained`` requires), ``config.json`` with the base
model config and ``quantization_config``), but shards are filled in order up to a size,
as the quantizing tools do, and written as a stream: ``save_checkpoint`` and
``safetensors.torch.save_file`` take every tensor of a file at once.

The safetensors file format, as this writer relies on it: an 8-byte little-endian
unsigned header length, then that many bytes of JSON (padded with spaces so that the data
starts 8-byte aligned) mapping each tensor name to ``dtype`` (``I32``, ``I64``, ``F16``,
``BF16``), ``shape`` and ``data_offsets`` ``[begin, end)`` into the data that follows,
plus an optional ``__metadata__`` object of strings; then the tensors' bytes, C order,
little-endian, back to back with no gap. Since every shape is known before a byte is
drawn, a shard's header is written first and its tensors appended as they are drawn.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from quantcore.checkpoint.writer import config_for
from quantcore.formats.awq import AWQ
from quantcore.formats.base import Format
from quantcore.formats.compressed_tensors import CompressedTensors
from quantcore.formats.gptq import GPTQ
from quantcore.formats.gptq.convert import zero_to_stored
from quantcore.formats.packing import pack_codes

__all__ = ["FORMATS", "LINEARS", "Llama", "Unit", "Written", "linear_tensors", "plan_shards",
           "quantization_config", "units", "write_checkpoint"]

#: The probe's formats, as a 7B checkpoint of each is usually published.
FORMATS: dict[str, Format] = {
    "gptq4": GPTQ(bits=4, group_size=128, sym=True, desc_act=False, checkpoint_format="v1"),
    "awq4": AWQ(bits=4, group_size=128, zero_point=True),
    "ct4": CompressedTensors(bits=4, group_size=128, sym=True),
}

#: A decoder layer's quantized linears: name → (out features, in features) given the
#: hidden and intermediate sizes.
LINEARS: dict[str, Callable[[int, int], tuple[int, int]]] = {
    "self_attn.q_proj": lambda h, i: (h, h),
    "self_attn.k_proj": lambda h, i: (h, h),
    "self_attn.v_proj": lambda h, i: (h, h),
    "self_attn.o_proj": lambda h, i: (h, h),
    "mlp.gate_proj": lambda h, i: (i, h),
    "mlp.up_proj": lambda h, i: (i, h),
    "mlp.down_proj": lambda h, i: (h, i),
}

_DTYPES = {torch.int32: "I32", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16"}


@dataclass(frozen=True)
class Llama:
    """The model's shapes (Llama-2-7B's by default; multi-head attention, head size 128)."""

    layers: int = 32
    hidden: int = 4096
    intermediate: int = 11008
    vocab: int = 32000

    def config(self) -> dict[str, Any]:
        """The model's ``config.json`` (without ``quantization_config``)."""
        import transformers

        heads = max(1, self.hidden // 128)
        config = transformers.LlamaConfig(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, num_attention_heads=heads, num_key_value_heads=heads,
            max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
            architectures=["LlamaForCausalLM"], dtype="bfloat16",
        )
        return config.to_dict()  # type: ignore[no-any-return]


# --- what one quantized linear stores ------------------------------------------------------------


def _lanes(shape: tuple[int, ...], gen: torch.Generator | None) -> torch.Tensor:
    """Random int32 lanes: every bit pattern, so every packed 4-bit field, equally likely."""
    if gen is None:
        return torch.empty(shape, dtype=torch.int32, device="meta")
    count = 1
    for n in shape:
        count *= n
    return torch.randint(0, 256, (count * 4,), dtype=torch.uint8, generator=gen).view(torch.int32).view(shape)


def _scales(shape: tuple[int, int], dtype: torch.dtype, gen: torch.Generator | None) -> torch.Tensor:
    if gen is None:
        return torch.empty(shape, dtype=dtype, device="meta")
    return (torch.rand(shape, generator=gen) * 0.01 + 0.001).to(dtype)


def linear_tensors(
    fmt: Format, out_features: int, in_features: int, gen: torch.Generator | None
) -> dict[str, torch.Tensor]:
    """Random tensors of one linear as ``fmt`` stores them (no bias); with ``gen=None``
    the same tensors on ``meta``: their names, shapes and dtypes only."""
    device = "meta" if gen is None else "cpu"
    groups = fmt.num_groups(in_features)  # type: ignore[attr-defined]
    if isinstance(fmt, GPTQ):
        if fmt.sym or gen is None:  # sym: the one zero point 2^(b-1), stored by the format's own rule
            zeros = torch.full((groups, out_features), 1 << (fmt.bits - 1), dtype=torch.int32, device=device)
        else:
            zeros = torch.randint(0, fmt.maxq + 1, (groups, out_features), dtype=torch.int32, generator=gen)
        gs = fmt.effective_group_size(in_features)
        return {
            "qweight": _lanes((in_features * fmt.bits // 32, out_features), gen),
            "qzeros": pack_codes(zero_to_stored(zeros, fmt), fmt.bits, dim=1, lane_dtype=fmt.pack_dtype),
            "scales": _scales((groups, out_features), torch.float16, gen),
            "g_idx": (torch.arange(in_features, device=device) // gs).to(torch.int32),
        }
    if isinstance(fmt, AWQ):
        return {
            "qweight": _lanes((in_features, out_features * fmt.bits // 32), gen),
            "qzeros": _lanes((groups, out_features * fmt.bits // 32), gen),
            "scales": _scales((groups, out_features), torch.float16, gen),
        }
    if isinstance(fmt, CompressedTensors):
        tensors = {
            "weight_packed": _lanes((out_features, in_features * fmt.bits // 32), gen),
            "weight_scale": _scales((out_features, groups), torch.bfloat16, gen),
            "weight_shape": torch.tensor([out_features, in_features], dtype=torch.int64, device=device),
        }
        if not fmt.sym:
            tensors["weight_zero_point"] = _lanes((out_features * fmt.bits // 32, groups), gen)
        return tensors
    raise TypeError(f"no random tensors for format {fmt.slug}")


def quantization_config(fmt: Format) -> dict[str, Any]:
    """The ``quantization_config`` a quantizing tool writes for ``fmt``."""
    if isinstance(fmt, CompressedTensors):
        return {
            "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": fmt.bits, "type": "int", "symmetric": fmt.sym, "strategy": "group",
                "group_size": fmt.group_size, "actorder": None, "dynamic": False}}},
        }
    return config_for(fmt)


# --- the checkpoint, unit by unit -----------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """Tensors drawn and written together: the embeddings, one decoder layer, or the head."""

    name: str
    specs: tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]
    draw: Callable[[torch.Generator], dict[str, torch.Tensor]]


def _dense(shape: tuple[int, ...], gen: torch.Generator, std: float = 0.02) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.bfloat16).mul_(std)


def _norm(size: int, gen: torch.Generator | None) -> torch.Tensor:
    if gen is None:
        return torch.empty(size, dtype=torch.bfloat16, device="meta")
    return (1 + torch.randn(size, generator=gen) * 0.05).to(torch.bfloat16)


def _specs(tensors: dict[str, torch.Tensor]) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
    return tuple((name, t.dtype, tuple(t.shape)) for name, t in tensors.items())


def _layer(fmt: Format, model: Llama, i: int) -> Unit:
    prefix = f"model.layers.{i}"

    def draw(gen: torch.Generator | None) -> dict[str, torch.Tensor]:
        tensors = {f"{prefix}.input_layernorm.weight": _norm(model.hidden, gen)}
        for name, shape in LINEARS.items():
            out_features, in_features = shape(model.hidden, model.intermediate)
            for leaf, t in linear_tensors(fmt, out_features, in_features, gen).items():
                tensors[f"{prefix}.{name}.{leaf}"] = t
        tensors[f"{prefix}.post_attention_layernorm.weight"] = _norm(model.hidden, gen)
        return tensors

    return Unit(prefix, _specs(draw(None)), draw)


def units(fmt: Format, model: Llama) -> list[Unit]:
    """The checkpoint in the order it is written: embeddings, layers, final norm and head."""
    h, v = model.hidden, model.vocab
    embed = Unit("model.embed_tokens", (("model.embed_tokens.weight", torch.bfloat16, (v, h)),),
                 lambda gen: {"model.embed_tokens.weight": _dense((v, h), gen)})
    head = Unit("lm_head", (("model.norm.weight", torch.bfloat16, (h,)), ("lm_head.weight", torch.bfloat16, (v, h))),
                lambda gen: {"model.norm.weight": _norm(h, gen), "lm_head.weight": _dense((v, h), gen)})
    return [embed, *(_layer(fmt, model, i) for i in range(model.layers)), head]


# --- streaming safetensors shards ------------------------------------------------------------------


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count * dtype.itemsize


@dataclass
class _Shard:
    file: str
    specs: list[tuple[str, torch.dtype, tuple[int, ...]]] = field(default_factory=list)
    nbytes: int = 0


def plan_shards(all_units: list[Unit], shard_bytes: int) -> list[_Shard]:
    """Tensors into shards in write order, a new shard when the next tensor would pass
    ``shard_bytes`` (a tensor larger than that gets a shard of its own)."""
    shards = [_Shard("")]
    for unit in all_units:
        for name, dtype, shape in unit.specs:
            size = _nbytes(dtype, shape)
            if size % 8:
                raise ValueError(f"{name}: {size} bytes is not a multiple of 8; every tensor of this writer "
                                 "keeps the next one 8-byte aligned")
            if shards[-1].specs and shards[-1].nbytes + size > shard_bytes:
                shards.append(_Shard(""))
            shards[-1].specs.append((name, dtype, shape))
            shards[-1].nbytes += size
    for i, shard in enumerate(shards):
        shard.file = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    return shards


class _ShardWriter:
    """One safetensors file: its header from the specs, then each tensor as it comes, in order."""

    def __init__(self, path: Path, shard: _Shard) -> None:
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dtype, shape in shard.specs:
            end = offset + _nbytes(dtype, shape)
            header[name] = {"dtype": _DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, end]}
            offset = end
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(8 + len(raw)) % 8)
        self.path, self.pending = path, list(shard.specs)
        self.file: BinaryIO = path.open("wb")
        self.file.write(struct.pack("<Q", len(raw)) + raw)

    def write(self, name: str, t: torch.Tensor) -> None:
        expected = self.pending.pop(0)
        if expected != (name, t.dtype, tuple(t.shape)):
            raise RuntimeError(f"{self.path.name}: expected {expected} next, got {(name, t.dtype, tuple(t.shape))}")
        # Viewed as bytes, any dtype (bfloat16 included) is written as it lies in memory, uncopied.
        self.file.write(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()))

    def close(self) -> None:
        self.file.close()
        if self.pending:
            raise RuntimeError(f"{self.path.name}: {len(self.pending)} tensors were planned and not written")


@dataclass
class Written:
    """What was written, and the sizes the memory claim is judged against."""

    folder: Path
    files: list[str]
    total_bytes: int
    #: bytes of one decoder layer's quantized tensors (its seven linears; every layer the same)
    layer_bytes: int
    #: the largest quantized tensor (name, bytes)
    largest_quantized: tuple[str, int]
    #: every dense tensor larger than one layer's norms: name → bytes
    dense: dict[str, int]


def write_checkpoint(
    folder: str | Path, kind: str = "gptq4", model: Llama | None = None, *, seed: int = 0,
    shard_bytes: int = 2 * 10**9, progress: Callable[[str], None] | None = None,
) -> Written:
    """Write the checkpoint of ``model`` in format ``kind`` (a key of :data:`FORMATS`)
    into ``folder``; only one unit's tensors (a decoder layer at most, or one of the two
    vocabulary-sized tensors) exist at a time."""
    fmt, model = FORMATS[kind], model or Llama()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    all_units = units(fmt, model)
    shards = plan_shards(all_units, shard_bytes)
    where = {name: shard for shard in shards for name, _, _ in shard.specs}
    writers: dict[str, _ShardWriter] = {}
    gen = torch.Generator().manual_seed(seed)
    for number, unit in enumerate(all_units):
        tensors = unit.draw(gen)
        for name in list(tensors):
            shard = where[name]
            if shard.file not in writers:
                for done in writers.values():
                    done.close()
                writers = {shard.file: _ShardWriter(folder / shard.file, shard)}
            writers[shard.file].write(name, tensors[name])
        del tensors  # before the next unit is drawn: one unit's tensors at a time
        if progress and (number % 8 == 0 or number == len(all_units) - 1):
            progress(f"wrote {unit.name} ({number + 1}/{len(all_units)} units)")
    for done in writers.values():
        done.close()
    if len(shards) > 1:
        weight_map = {name: shard.file for shard in shards for name, _, _ in shard.specs}
        # transformers' from_pretrained also needs "metadata" (the quantizing tools write total_size).
        index = {"metadata": {"total_size": sum(s.nbytes for s in shards)}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    config = model.config()
    config["quantization_config"] = quantization_config(fmt)
    (folder / "config.json").write_text(json.dumps(config, indent=1))

    layer = all_units[1].specs if model.layers else ()
    quantized = [(n, _nbytes(d, s)) for n, d, s in layer if not n.endswith("layernorm.weight")]
    largest = max(quantized, key=lambda x: x[1]) if quantized else ("", 0)
    norm = _nbytes(torch.bfloat16, (model.hidden,))
    dense = {n: _nbytes(d, s) for u in (all_units[0], all_units[-1]) for n, d, s in u.specs if _nbytes(d, s) > norm}
    return Written(folder, [s.file for s in shards], sum(s.nbytes for s in shards), sum(b for _, b in quantized),
                   largest, dense)
