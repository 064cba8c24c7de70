"""Eager calls of a block replayed from CUDA graphs: what a call costs the host becomes
one copy in, one graph launch and one copy out.

An eager call of a quantized block pays the host for every launch in it (the linears,
the activation, a tensor-parallel all-reduce), which at decode-sized M is more than the
GPU's time: two GPUs then run the block slower than one. Engines capture decode per
batch size for this reason. :class:`GraphedEager` does it for one module and any caller
that runs it eagerly (``generate`` without ``torch.compile``, a tensor-parallel rank):

* the rows of a call are its leading dims together (``[B, T, H]`` is ``B·T`` rows of
  ``H``), padded up to a bucket (1, 2, 4, … up to ``max_rows``); each bucket is
  captured once, on its first call, after two warm-up calls that compile, plan and
  allocate outside the capture;
* a call copies ``x`` into the bucket's static input, replays the graph and returns a
  copy of the first M rows of its static output. The block must be row-wise (each
  output row depends on the same input row only: linears, activations, an all-reduce
  of the rows), so the padding rows — whatever an earlier call left there — never reach
  a returned row;
* each CUDA stream has its own graphs and static tensors: two streams calling the block
  at once (two micro-batches overlapped) never write one static input;
* anything else runs the module itself: a CPU tensor, more rows than ``max_rows``, a
  call being traced (``torch.compile``, fake tensors) or recorded into a graph of the
  caller's, a call with autograd on an input that needs it, and a bucket whose capture
  failed (a block that waits for the GPU, a collective run on the host: one warning says
  why);
* the graphs read the module's tensors where they were at capture: every call compares
  the prepared states of the block's :class:`~quantcore.nn.quant_module.QuantModule` s
  (a load, a move or a fallback makes new ones) and captures again after a change.
  Tensors changed in place are read as they are (the same memory); other parameters
  swapped for new tensors are not seen — call :meth:`GraphedEager.reset`.

Every rank of a tensor-parallel group calls the block with the same M, so the ranks
warm up and capture the same calls in the same order, all-reduce included (NCCL's
collectives can be captured). A block with ``prepare_all_reduce`` (``ParallelQuantMLP``)
is prepared for ``max_rows`` rows before its first capture. The group's default path
(``"auto"``: the one-shot sum over symmetric memory for decode messages) is the cheaper one
to replay: a replay cost 7.6 µs over the block's time inside a graph of many calls on two
H200s, against 21 µs with NCCL's all-reduce in the graph (docs/tensor-parallel.md).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import InvalidArgumentError, QuantCoreError, QuantCoreWarning
from ..triton.buffers import stream_key
from .quant_module import QuantModule

__all__ = ["GraphedEager", "graph_submodules", "row_bucket"]

#: Warm-up calls before a capture: the first compiles and plans, the second runs as the
#: capture will (a kernel that plans on its first call at an M runs its second as planned).
WARMUP_CALLS = 2


def row_bucket(m: int) -> int:
    """The rows a call of ``m`` rows is padded to: the next power of two."""
    return 1 << (m - 1).bit_length() if m > 1 else 1


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    x: torch.Tensor
    out: torch.Tensor


class GraphedEager(nn.Module):
    """``inner`` (a row-wise module over ``[..., K]``: every leading dim a row) with its
    eager calls of up to ``max_rows`` rows on CUDA replayed from a CUDA graph per row
    bucket (module docstring)."""

    def __init__(self, inner: nn.Module, *, max_rows: int = 16) -> None:
        super().__init__()
        if not isinstance(max_rows, int) or isinstance(max_rows, bool) or not 1 <= max_rows <= 4096:
            raise InvalidArgumentError(f"GraphedEager max_rows: expected an int in 1…4096, got {max_rows!r}")
        self.inner = inner
        self.max_rows = max_rows
        self._graphs: dict[tuple[Any, ...], _Captured] = {}
        #: Buckets whose capture failed, and why: their calls run the module itself.
        self._refused: dict[tuple[Any, ...], str] = {}
        self._pool: Any = None
        self._quant = [m for m in inner.modules() if isinstance(m, QuantModule)]
        self._states: list[Any] = []
        self._prepared_rows = 0
        #: Captures made (tests and benchmarks read it).
        self.captures = 0

    def reset(self) -> None:
        """Drop every graph (and its memory): the next calls capture again."""
        self._graphs.clear()
        self._refused.clear()
        self._pool = None

    def graphed(self, x: torch.Tensor) -> bool:
        """Whether a call with ``x`` replays a graph (else it runs ``inner`` itself)."""
        return (isinstance(x, torch.Tensor) and x.is_cuda and x.dim() >= 2
                and 0 < x.numel() // x.shape[-1] <= self.max_rows
                and not (x.requires_grad and torch.is_grad_enabled())
                and not torch.compiler.is_compiling() and not torch.cuda.is_current_stream_capturing()
                and type(x) is torch.Tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.graphed(x):
            return self.inner(x)
        self._follow_states()
        rows = x.reshape(-1, x.shape[-1])  # every leading dim is rows: [B, T, H] as [B·T, H]
        m = rows.shape[0]
        key = (row_bucket(m), rows.shape[1], x.dtype, x.device, stream_key(x.device))
        cap = self._graphs.get(key)
        if cap is None:
            if key in self._refused:
                return self.inner(x)
            try:
                cap = self._graphs[key] = self._capture(key[0], rows)
            except QuantCoreError:  # the input's fault (the module's checks): the caller's to see
                raise
            except Exception as exc:  # not capturable (a host sync, a host-side collective): stay eager
                torch.cuda.synchronize(x.device)
                self._refused[key] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                warnings.warn(f"GraphedEager: {type(self.inner).__name__} cannot be captured at {key[0]} rows, "
                              f"so its calls run eagerly: {self._refused[key]}", QuantCoreWarning, stacklevel=2)
                return self.inner(x)
        cap.x[:m].copy_(rows)
        cap.graph.replay()
        return cap.out[:m].clone().view(*x.shape[:-1], cap.out.shape[-1])

    def _follow_states(self) -> None:
        states = [q.prepared for q in self._quant]
        if len(states) != len(self._states) or any(a is not b for a, b in zip(states, self._states, strict=False)):
            self.reset()
            self._states = states

    def _capture(self, rows: int, x: torch.Tensor) -> _Captured:
        device = x.device
        prepare = getattr(self.inner, "prepare_all_reduce", None)
        if prepare is not None and self._prepared_rows < self.max_rows:
            prepare(self.max_rows)
            self._prepared_rows = self.max_rows
        static_x = torch.zeros((rows, *x.shape[1:]), dtype=x.dtype, device=device)
        static_x[: x.shape[0]].copy_(x)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.inner(static_x)
        torch.cuda.current_stream(device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out = self.inner(static_x)
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != rows:
            raise InvalidArgumentError(f"GraphedEager: the block must return one [rows, N] tensor of its {rows} rows, "
                                       f"got {type(out).__name__} {tuple(getattr(out, 'shape', ()))}")
        self.captures += 1
        return _Captured(graph, static_x, out)


def graph_submodules(model: nn.Module, names: tuple[str, ...] = ("mlp",), *, max_rows: int = 16) -> list[str]:
    """Wrap every submodule of ``model`` whose own name is in ``names`` in
    :class:`GraphedEager` (in place); returns their qualified names. The default is the
    MLP block of Hugging Face's decoder layers (``model.layers.N.mlp``): row-wise, where
    attention is not (it reads a cache and positions). Already wrapped ones are kept."""
    found = [(qual, mod) for qual, mod in model.named_modules()
             if qual and qual.rsplit(".", 1)[-1] in names and not isinstance(mod, GraphedEager)]
    for qual, mod in found:
        parent_name, _, leaf = qual.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if isinstance(parent, GraphedEager):
            continue
        setattr(parent, leaf, GraphedEager(mod, max_rows=max_rows))
    return [qual for qual, _ in found]
