"""Launching the fused SVDQuant pre-GEMM (:mod:`.triton_source`) for the price of a launch.

A :class:`Bucket` holds what a call decides once per prepared layer, padded row count
(``M_pad``: the tile and the stream-K geometry follow it) and activation dtype: the tile,
the grid, the constexprs, the compiled kernel bound to its launcher
(:class:`quantcore.triton.launch.Launch`), the outputs' shapes and dtypes, and, per stream,
the kept scratch its shared row tiles use. ``triton_kernel.TritonActQuantLora.forward``
keeps buckets with the layer's LoRA tensor. A call's host work is the same at every M: three
output allocations and the launch (the kernel casts the outputs' pointers to the types it
writes, where a bit view would cost the host a tensor). Imports triton: loaded on the first call.
"""

from __future__ import annotations

from typing import Any

import torch

from ...formats.svdquant import SVDQuantAct
from ...ops.act_quant_lora import ActQuantLoraOutput
from ...triton.buffers import KeptBuffers, capturing, current_stream, stream_key
from ...triton.launch import Launch, launch_state
from ...triton.unowned import unowned
from .base import output_layout
from .tile import Tile, launch_geometry, rank_block
from .triton_source import act_quant_lora_kernel

__all__ = ["VARYING", "Bucket", "keeps_scratch", "launch_state"]

#: The arguments that change between calls of a bucket and that Triton specialises: x,
#: its row stride and M. (The outputs and workspaces are fresh allocations or kept
#: buffers; q is not specialised; pointers a launch never reads are a fixed stand-in.)
VARYING = (0, 1, 9)
#: The layer's tensors (the reciprocal smoothing, the LoRA down-projection, or the unread
#: stand-in in their place): the same objects at every call of a bucket, handed to the
#: launcher as addresses; and the LoRA output, which is the stand-in too at rank 0.
FIXED = (2, 3)
LORA_OUT = 6
#: The outputs (q, its scales; the LoRA output where R > 0) and the scratch (partials,
#: tickets, or the LoRA output in their place): the bucket's own allocations on its device,
#: handed to the launcher as addresses.
OWN = (4, 5, 7, 8)

#: Per-row-tile tickets, zero between calls (the last program of a tile resets its own),
#: and the LoRA partials of shared row tiles (each written before it is read, in the same
#: launch): one buffer of each per device and stream, so concurrent streams never share
#: them, and a call allocates neither.
_TICKETS = KeptBuffers(torch.int32, zero=True, minimum=1024)
_PARTIALS = KeptBuffers(torch.float32, zero=False)


def keeps_scratch(device: torch.device) -> bool:
    """Whether a launch on ``device`` takes its tickets and partials from the kept buffers:
    on CUDA, whose launches on one stream run in order. Elsewhere (the interpreter on a
    CPU, where two threads may run launches at once) a call makes its own."""
    return device.type == "cuda"


class Bucket:
    """One tile of one prepared layer at one ``M_pad``, dtype and device."""

    def __init__(self, fmt: SVDQuantAct, prepared: Any, tile: Tile, m_pad: int, dtype: torch.dtype,
                 device: torch.device, *, compiled: bool, interpreted: bool, sms: int, gpu_math: bool) -> None:
        """``prepared``: the layer's ``SVDQuantWeights``; ``compiled``: CUDA without the
        interpreter (PTX, a register cap); ``interpreted``: Triton's interpreter runs it;
        ``sms``: the device's SM count; ``gpu_math``: the GPU's arithmetic paths."""
        n, r = prepared.n, prepared.r
        self.r, self.fp4, self.device, self.m_pad = r, fmt.fp4, device, m_pad
        programs, self.row_tiles, self.slots = launch_geometry(tile, m_pad, n, sms)
        if not compiled and tile.grid == 0:
            programs = self.row_tiles  # the interpreter: whole row tiles, no partials
        self.grid = (programs, 1, 1)
        self.shared = bool(r) and programs > 1  # row tiles split between programs: partials and tickets
        self.keeps = keeps_scratch(device)
        #: The device's current stream (its raw handle): what the kept scratch is kept by.
        self._stream = current_stream(device)
        #: Per stream, the kept partials and tickets this bucket's launches use there.
        self._scratch: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.layout = output_layout(fmt, m_pad, n, r)
        self.part_numel = self.row_tiles * self.slots * tile.bm * r
        #: Stands in for the pointers a launch never reads (no smooth, no LoRA), in x's dtype.
        self.unread = torch.empty(8, dtype=dtype, device=device)
        self.rsmooth = prepared.rsmooth  # with lora_down, the weight this bucket was made for
        self.rs = prepared.rsmooth if prepared.rsmooth is not None else self.unread
        # lora_down owns the launch state this is kept in: bound as a tensor over its memory
        # that does not refer to it (quantcore/triton/unowned.py).
        self.w = unowned(prepared.lora_down) if r else self.unread
        extra = {"maxnreg": tile.maxnreg} if compiled and tile.maxnreg else {}
        self.launch = Launch(
            act_quant_lora_kernel, device=device, varying=VARYING,
            fixed_pointers=FIXED if r else (*FIXED, LORA_OUT), own_pointers=(*OWN, LORA_OUT) if r else OWN,
            constexprs=dict(N=n, R=r, FP4=fmt.fp4, HAS_SMOOTH=prepared.rsmooth is not None,
                            INTERPRETED=interpreted, GPU_MATH=gpu_math, PTX=compiled,
                            TREE=tile.tree, BM=tile.bm, BN=tile.bn, BR=rank_block(r), FLAT=tile.flat,
                            PREFETCH=tile.prefetch, RED=tile.red, SLOTS=self.slots if tile.flat else 0,
                            NT=32 * tile.num_warps if tile.flat else 0),
            options=dict(num_warps=tile.num_warps, num_stages=tile.num_stages, enable_fp_fusion=False, **extra),
        )

    def __call__(self, x: torch.Tensor, row_stride: int, m: int) -> ActQuantLoraOutput:
        """The outputs for ``x``'s ``m`` rows (``x`` checked, its rows unit-strided and
        ``row_stride`` apart)."""
        (q_shape, q_dtype), (s_shape, s_dtype), (l_shape, l_dtype) = self.layout
        device = self.device
        # The sizes as arguments, not one tuple: torch parses them faster (docs/triton-launch.md).
        qout = torch.empty(*q_shape, dtype=q_dtype, device=device)
        oscales = torch.empty(*s_shape, dtype=s_dtype, device=device)
        lora = torch.empty(*l_shape, dtype=l_dtype, device=device)
        stream = None
        if not self.shared:
            part = tickets = lora  # never read: no row tile is shared
        elif self.keeps:
            # The stream read once: it keys the kept scratch, and the launch is handed it.
            stream = self._stream()
            hit = self._scratch.get(stream)
            part, tickets = hit if hit is not None else self._kept_scratch(stream)
        else:
            part = torch.empty(self.part_numel, dtype=torch.float32, device=device)
            tickets = torch.zeros(self.row_tiles, dtype=torch.int32, device=device)
        args = (x, row_stride, self.rs, self.w, qout, oscales, lora if self.r else self.unread, part, tickets, m,
                self.m_pad, self.slots)
        if stream is None:
            self.launch(self.grid, *args)
        else:
            self.launch.on(stream, self.grid, *args)
        # What the named tuple's own constructor does, without its Python frame.
        return tuple.__new__(ActQuantLoraOutput, (qout, oscales, lora))

    def _kept_scratch(self, stream: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The partials and tickets of ``stream`` (the current one when not given): the kept
        buffers, remembered per stream after the first call there. One that a larger bucket
        outgrows stays valid for this one (an outgrown buffer is retired, never freed, and
        still holds what this bucket needs); one made for a graph being captured is that
        graph's alone and not remembered."""
        if stream is None:
            stream = self._stream()
        hit = self._scratch.get(stream)
        if hit is not None:
            return hit
        key = stream_key(self.device)  # the current stream again, with the device: the kept buffers' key
        hit = (_PARTIALS.get(key, self.part_numel, self.device), _TICKETS.get(key, self.row_tiles, self.device))
        if not capturing(self.device):
            self._scratch[stream] = hit
        return hit
