"""Tensor-parallel quantized linears on ``torch.distributed``: each rank holds its shard of
a layer (``Format.shard``) and runs it through the kernel ``bind`` picks for its device;
the engine's collective (an all-reduce after a row-parallel layer) is the process group's
own (gloo, NCCL, …) or, chosen per group, torch's one-shot kernel over symmetric memory
for small messages (:mod:`.allreduce`).

A gated MLP runs its gate and up projections as one launch per rank where the format
can concatenate them (:class:`FusedColumnParallelQuantLinear`, ``fuse_gate_up``).

The rule that keeps ranks from hanging: everything that can refuse — the world size,
the rank, a cut that is not on a lane or group boundary, layers whose dims do not chain,
a pre-sharded layer whose shards disagree (formats, group sizes, dims) — is checked at
construction, from what every rank holds alike (the layer's format and shapes, the
world size, the list of shards), so every rank raises the same
:class:`~quantcore.errors.ShardError` before any collective is entered.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import FusionError, QuantCoreWarning, ShardError
from ..formats.base import Format
from ..formats.sharding import Shard, check_shards
from ..kernels.gated_activation import ACTIVATIONS
from ..nn.quant_module import runs_hooks
from .allreduce import AllReducer
from .module import QuantLinear

__all__ = [
    "ColumnParallelQuantLinear",
    "FusedColumnParallelQuantLinear",
    "ParallelQuantMLP",
    "RowParallelQuantLinear",
    "TPGroup",
    "fused_shard_tensors",
]


@dataclass(frozen=True)
class TPGroup:
    """This process's place in a tensor-parallel group: ``rank`` of ``world``, and the
    ``torch.distributed`` process group the all-reduce runs on (``None``: the default one).
    ``world=1`` needs no process group at all. ``stage_on_host`` copies a device tensor
    to the CPU for the all-reduce and back (for a backend that takes only CPU tensors).
    ``all_reduce_path`` picks how the all-reduce runs (:mod:`.allreduce`): ``"backend"``
    the process group's own, ``"one_shot"`` torch's one-shot kernel over symmetric memory,
    ``"auto"`` (the default) one-shot for messages up to ``ONE_SHOT_MAX_BYTES`` where it can
    run — on two H100s and two H200s it was as fast as NCCL's or faster at every M measured,
    eager and under CUDA graphs (docs/tensor-parallel.md)."""

    rank: int
    world: int
    group: Any = None
    stage_on_host: bool = False
    all_reduce_path: str = "auto"
    reducer: AllReducer = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.world, int) or isinstance(self.world, bool) or self.world < 1:
            raise ShardError(f"TPGroup world: expected an int >= 1, got {self.world!r}")
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or not 0 <= self.rank < self.world:
            raise ShardError(f"TPGroup rank: expected an int in [0, {self.world}) for world={self.world}, got {self.rank!r}")
        object.__setattr__(self, "reducer", AllReducer(self.all_reduce_path, group=self.group,
                                                       stage_on_host=self.stage_on_host))

    @classmethod
    def current(cls, group: Any = None, *, stage_on_host: bool = False, all_reduce_path: str = "auto") -> TPGroup:
        """The group of an initialised ``torch.distributed`` (the default group, or ``group``)."""
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ShardError("TPGroup.current: torch.distributed is not initialised (call init_process_group first)")
        return cls(dist.get_rank(group), dist.get_world_size(group), group, stage_on_host, all_reduce_path)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """The sum of ``t`` over the group: ``t`` itself for one rank or on the backend's path
        (summed in place), a new tensor on the one-shot path — use the return value."""
        return t if self.world == 1 else self.reducer(t)

    def prepare_all_reduce(self, max_tokens: int, hidden: int, dtype: torch.dtype,
                           device: torch.device | str) -> str:
        """Before capturing a CUDA graph: make what all-reduces of up to ``[max_tokens,
        hidden]`` need (the one-shot buffer: a collective, so every rank calls it alike).
        Returns the path the largest takes: ``"none"`` (one rank), ``"backend"`` or ``"one_shot"``."""
        return "none" if self.world == 1 else self.reducer.prepare(max_tokens * hidden, dtype, device)

    def all_reduce_path_for(self, tokens: int, hidden: int, dtype: torch.dtype, device: torch.device | str) -> str:
        """The path an all-reduce of ``[tokens, hidden]`` takes (``"none"`` for one rank)."""
        return "none" if self.world == 1 else self.reducer.path_for(tokens * hidden, dtype, device)


def _local(shard: Shard, device: str | torch.device | None, dtype: torch.dtype, prefer: Any) -> QuantLinear:
    return QuantLinear(shard.format, shard.tensors, device=device, dtype=dtype, prefer=prefer)


def _device_of(module: nn.Module) -> torch.device:
    """Where a prepared layer's weights live (its buffers)."""
    held = next(iter(module.buffers()), None)
    return held.device if held is not None else torch.device("cpu")


def _kernel_name(layer: Any) -> str:
    """The kernel a parallel layer's local part runs on (none while it is unbound)."""
    kernel = layer.local.kernel
    return kernel.name if kernel is not None else "none"


def _pick(shards: Sequence[Shard], tp: TPGroup, dim: str) -> Shard:
    """This rank's shard of a complete set, after checking the whole set (on every rank)."""
    check_shards(shards)
    first = shards[0]
    if first.dim != dim:
        raise ShardError(f"{first.parent.slug} shards: cut along {first.dim}, this layer needs {dim}")
    if first.world != tp.world:
        raise ShardError(f"{first.parent.slug} shards: made for world={first.world}, this group has {tp.world} ranks")
    return next(s for s in shards if s.rank == tp.rank)


class ColumnParallelQuantLinear(nn.Module):
    """Outputs ``[r·N/w, (r+1)·N/w)`` of ``y = x Wᵀ + b`` on rank r: the whole ``x`` in,
    this rank's slice of the outputs out (no collective)."""

    def __init__(self, shard: Shard, tp: TPGroup, *, device: str | torch.device | None = None,
                 dtype: torch.dtype = torch.bfloat16, prefer: str | Sequence[str] | None = None) -> None:
        super().__init__()
        self.shard, self.tp = shard, tp
        self.local = _local(shard, device, dtype, prefer)

    @classmethod
    def from_tensors(cls, fmt: Format, tensors: Mapping[str, torch.Tensor], tp: TPGroup, **kw: Any) -> ColumnParallelQuantLinear:
        return cls(fmt.shard(tensors, dim="N", rank=tp.rank, world=tp.world), tp, **kw)

    @classmethod
    def from_shards(cls, shards: Sequence[Shard], tp: TPGroup, **kw: Any) -> ColumnParallelQuantLinear:
        return cls(_pick(shards, tp, "N"), tp, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.local(x)


def fused_shard_tensors(shards: Mapping[str, Shard]) -> tuple[Format, dict[str, torch.Tensor]]:
    """One layer's stored tensors from column shards that read the same input, laid end
    to end along N in the order given (the format's ``concat``, bit for bit). A shard
    without a bias gets zeros where another has one: adding zero changes no output, and
    the parts' outputs stay the ones they had apart. A :class:`FusionError` says why not."""
    names = list(shards)
    fmt = shards[names[0]].format
    for name in names[1:]:
        if shards[name].format != fmt:
            raise FusionError(f"{names[0]} shard is {fmt.slug}, {name} shard is {shards[name].format.slug}")
    if not fmt.concatenates:
        raise FusionError(f"the {fmt.name} format defines no concatenation along N")
    biased = next((s.tensors["bias"] for s in shards.values() if "bias" in s.tensors), None)
    parts = []
    for s in shards.values():
        tensors = dict(s.tensors)
        if biased is not None and "bias" not in tensors:
            tensors["bias"] = biased.new_zeros(s.size)
        parts.append(tensors)
    return fmt, fmt.concat(parts, names=names)


class FusedColumnParallelQuantLinear(nn.Module):
    """Column-parallel layers that read the same input, run as one launch per rank:
    rank r's layer is its shard of every part laid end to end along N
    (:func:`fused_shard_tensors`), so the cut stays each part's own — rank r's fused
    layer is exactly ``concat(part₀ shard r, part₁ shard r, …)`` — and :meth:`split`
    hands each part its slice of the one output. Refuses (:class:`FusionError`) before
    anything is prepared where the shards cannot be concatenated."""

    def __init__(self, shards: Mapping[str, Shard], tp: TPGroup, *, device: str | torch.device | None = None,
                 dtype: torch.dtype = torch.bfloat16, prefer: str | Sequence[str] | None = None) -> None:
        super().__init__()
        fmt, tensors = fused_shard_tensors(shards)
        self.shards, self.tp = dict(shards), tp
        self.sizes = [s.size for s in self.shards.values()]
        self.local = QuantLinear(fmt, tensors, device=device, dtype=dtype, prefer=prefer)

    def split(self, y: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each part's outputs (views of ``y``), by name."""
        return dict(zip(self.shards, y.split(self.sizes, dim=-1), strict=True))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.split(self.local(x))


class RowParallelQuantLinear(nn.Module):
    """``y = x Wᵀ + b`` from this rank's inputs ``[r·K/w, (r+1)·K/w)``: a partial product
    (the bias on rank 0 only), then the all-reduce that sums the ranks' parts."""

    def __init__(self, shard: Shard, tp: TPGroup, *, device: str | torch.device | None = None,
                 dtype: torch.dtype = torch.bfloat16, prefer: str | Sequence[str] | None = None) -> None:
        super().__init__()
        self.shard, self.tp = shard, tp
        self.local = _local(shard, device, dtype, prefer)

    @classmethod
    def from_tensors(cls, fmt: Format, tensors: Mapping[str, torch.Tensor], tp: TPGroup, **kw: Any) -> RowParallelQuantLinear:
        return cls(fmt.shard(tensors, dim="K", rank=tp.rank, world=tp.world), tp, **kw)

    @classmethod
    def from_shards(cls, shards: Sequence[Shard], tp: TPGroup, **kw: Any) -> RowParallelQuantLinear:
        return cls(_pick(shards, tp, "K"), tp, **kw)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's part, before the all-reduce."""
        return self.local(x)

    def prepare_all_reduce(self, max_tokens: int) -> str:
        """What :meth:`TPGroup.prepare_all_reduce` makes for this layer's output, before a
        CUDA-graph capture; the path an all-reduce of ``max_tokens`` rows takes."""
        dtype = self.local.dtype
        if dtype is None:
            raise ShardError("prepare_all_reduce: the layer was built with dtype=None; build it with the activation "
                             "dtype the all-reduce will sum")
        return self.tp.prepare_all_reduce(max_tokens, self.local.out_features, dtype, _device_of(self.local))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.local(x))


class ParallelQuantMLP(nn.Module):
    """A transformer MLP block over a tensor-parallel group: ``down(act(gate(x)) · up(x))``
    (or ``down(act(up(x)))`` without ``gate``), ``gate`` and ``up`` column-parallel, ``down``
    row-parallel, one all-reduce per forward — the pair an engine builds (Megatron's).
    The dims must chain (``up: K → I``, ``down: I → K``) and every cut must be possible,
    which is checked for all layers before anything is prepared. ``act_order="groups"``
    cuts an act-order GPTQ ``down`` by whole groups (its kernels need no replicated
    scales and take even groups) and ``gate``/``up`` by the inputs those groups hold;
    other formats ignore it.

    ``fuse_gate_up`` (the default) runs ``gate`` and ``up`` as one column-parallel layer
    per rank, its shard of each laid end to end along N (:class:`FusedColumnParallelQuantLinear`):
    one launch instead of two, the same outputs. Where the format cannot concatenate the
    two (no concatenation along N; act-order layers with different ``g_idx``) the block
    falls back to two layers, warns once with the reason and keeps it in ``unfused_why``
    (the same on every rank: it reads only what every rank holds alike).

    A call runs each layer's :class:`~quantcore.nn.linear.QuantLinear` (``local``) itself,
    not the parallel wrapper around it: the wrappers add nothing to a call but a module
    call of their own, and the block's host cost per call should be its launches. The
    fused layer's output goes through :meth:`QuantLinear.gated <quantcore.nn.linear.QuantLinear.gated>`
    (``activation`` is a name of :data:`~quantcore.kernels.gated_activation.ACTIVATIONS`):
    the layer's launch ends with the activation and the product where its kernel does that
    (``hopper_wgmma``, SiLU), else one launch more on CUDA for them. Where a forward hook is registered on a wrapper (or globally) the call goes
    through the wrappers, so the hook runs and sees their outputs, and the activation is
    torch's ops on the parts the wrappers return."""

    def __init__(self, fmt: Format, layers: Mapping[str, Mapping[str, torch.Tensor]], tp: TPGroup, *,
                 activation: str = "silu", act_order: str = "replicate", fuse_gate_up: bool = True,
                 device: str | torch.device | None = None, dtype: torch.dtype = torch.bfloat16,
                 prefer: str | Sequence[str] | None = None) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ShardError(f"ParallelQuantMLP activation: expected one of {sorted(ACTIVATIONS)}, got {activation!r}")
        names = set(layers)
        if not ({"up", "down"} <= names <= {"gate", "up", "down"}):
            raise ShardError(f"ParallelQuantMLP layers: expected up, down and optionally gate, got {sorted(names)}")
        dims = {name: fmt.validate(t) for name, t in layers.items()}
        hidden, inter = dims["up"]["K"], dims["up"]["N"]
        if "gate" in dims and dims["gate"] != dims["up"]:
            raise ShardError(f"ParallelQuantMLP gate: {dims['gate']}, expected the shape of up {dims['up']}")
        if dims["down"] != {"K": inter, "N": hidden}:
            raise ShardError(f"ParallelQuantMLP down: {dims['down']}, expected K={inter} (up's N) and N={hidden} (up's K)")
        if act_order not in ("replicate", "groups"):
            raise ShardError(f"ParallelQuantMLP act_order: expected 'replicate' or 'groups', got {act_order!r}")
        kw: dict[str, Any] = {"device": device, "dtype": dtype, "prefer": prefer}
        # Every cut is made (and may refuse) before any kernel is prepared or collective run.
        # act_order="groups" (an act-order format's alternative row cut): down takes whole
        # groups, and gate/up produce exactly the inputs those groups hold, in that order.
        rule = act_order if act_order in fmt.shard_rules("K") else None
        down = fmt.shard(layers["down"], dim="K", rank=tp.rank, world=tp.world, rule=rule)
        shards = {name: fmt.shard(t, dim="N", rank=tp.rank, world=tp.world, index=down.index)
                  for name, t in layers.items() if name != "down"}
        shards["down"] = down
        self.tp, self.activation, self.gated = tp, activation, "gate" in shards
        self._act = ACTIVATIONS[activation]
        #: Why gate and up run as two layers ("" when they run as one).
        self.unfused_why = ("the block has no gate" if not self.gated else
                            "fuse_gate_up=False" if not fuse_gate_up else "")
        self.gate_up: FusedColumnParallelQuantLinear | None = None
        self.gate: ColumnParallelQuantLinear | None = None
        self.up: ColumnParallelQuantLinear | None = None
        if not self.unfused_why:
            try:
                self.gate_up = FusedColumnParallelQuantLinear({"gate": shards["gate"], "up": shards["up"]}, tp, **kw)
            except FusionError as exc:
                self.unfused_why = str(exc).splitlines()[0]
                warnings.warn(f"ParallelQuantMLP: gate and up run as two layers: {self.unfused_why}",
                              QuantCoreWarning, stacklevel=2)
        if self.gate_up is None:
            self.gate = ColumnParallelQuantLinear(shards["gate"], tp, **kw) if self.gated else None
            self.up = ColumnParallelQuantLinear(shards["up"], tp, **kw)
        self.down = RowParallelQuantLinear(shards["down"], tp, **kw)

    @classmethod
    def from_checkpoint(cls, ckpt: Any, prefix: str, tp: TPGroup, **kw: Any) -> ParallelQuantMLP:
        """The block whose linears are ``{prefix}.gate_proj``, ``{prefix}.up_proj`` and
        ``{prefix}.down_proj`` in a loaded :class:`~quantcore.checkpoint.Checkpoint`."""
        names = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
        layers = {role: ckpt.linears[f"{prefix}.{leaf}"] for role, leaf in names.items()
                  if f"{prefix}.{leaf}" in ckpt.linears}
        return cls(ckpt.format, layers, tp, **kw)

    def columns(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """This rank's outputs of the column-parallel layers, by role (``gate``, ``up``):
        one launch when they are fused."""
        if self.gate_up is not None:
            return self.gate_up(x)
        assert self.up is not None
        out = {"gate": self.gate(x)} if self.gate is not None else {}
        out["up"] = self.up(x)
        return out

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the intermediate activation."""
        gate_up = self.gate_up
        if gate_up is not None and not runs_hooks(gate_up):  # gate's and up's shards are alike: halves
            return gate_up.local.gated(x, self.activation)
        if gate_up is not None or runs_hooks(self.gate, self.up):  # through the wrappers: their hooks run
            cols = self.columns(x)
            return self._act(cols["gate"]) * cols["up"] if self.gated else self._act(cols["up"])
        assert self.up is not None
        if self.gate is None:
            return self._act(self.up.local(x))
        return self._act(self.gate.local(x)) * self.up.local(x)

    def kernels(self) -> dict[str, str]:
        """The kernel each role runs on (``gate`` and ``up`` name the fused layer's when fused)."""
        down = {"down": _kernel_name(self.down)}
        if self.gate_up is not None:
            name = _kernel_name(self.gate_up)
            return {"gate": name, "up": name, **down}
        layers = {"gate": self.gate, "up": self.up}
        return {role: _kernel_name(m) for role, m in layers.items() if m is not None} | down

    def shards(self) -> list[Shard]:
        """This rank's shard of every layer (gate and up each its own, fused or not)."""
        cols = list(self.gate_up.shards.values()) if self.gate_up is not None else \
            [m.shard for m in (self.gate, self.up) if m is not None]
        return [*cols, self.down.shard]

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's part of the output, before the all-reduce."""
        return self.down.local(self.hidden(x))

    def prepare_all_reduce(self, max_tokens: int) -> str:
        """Before a CUDA-graph capture of calls of up to ``max_tokens`` rows (every rank
        alike); the path the largest all-reduce takes."""
        return self.down.prepare_all_reduce(max_tokens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.partial(x))
