"""Tensor-parallel quantized linears on ``torch.distributed``: each rank holds its shard of
a layer (``Format.shard``) and runs it through the kernel ``bind`` picks for its device;
the engine's collectives (an all-reduce after a row-parallel layer) are torch's own, on
whatever process group the caller made (gloo, NCCL, …).

The rule that keeps ranks from hanging: everything that can refuse — the world size,
the rank, a cut that is not on a lane or group boundary, layers whose dims do not chain,
a pre-sharded layer whose shards disagree (formats, group sizes, dims) — is checked at
construction, from what every rank holds alike (the layer's format and shapes, the
world size, the list of shards), so every rank raises the same
:class:`~quantcore.errors.ShardError` before any collective is entered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ShardError
from ..formats.base import Format
from ..formats.sharding import Shard, check_shards
from .module import QuantLinear

__all__ = [
    "ColumnParallelQuantLinear",
    "ParallelQuantMLP",
    "RowParallelQuantLinear",
    "TPGroup",
]


@dataclass(frozen=True)
class TPGroup:
    """This process's place in a tensor-parallel group: ``rank`` of ``world``, and the
    ``torch.distributed`` process group the all-reduce runs on (``None``: the default one).
    ``world=1`` needs no process group at all. ``stage_on_host`` copies a device tensor
    to the CPU for the all-reduce and back (for a backend that takes only CPU tensors)."""

    rank: int
    world: int
    group: Any = None
    stage_on_host: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.world, int) or isinstance(self.world, bool) or self.world < 1:
            raise ShardError(f"TPGroup world: expected an int >= 1, got {self.world!r}")
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or not 0 <= self.rank < self.world:
            raise ShardError(f"TPGroup rank: expected an int in [0, {self.world}) for world={self.world}, got {self.rank!r}")

    @classmethod
    def current(cls, group: Any = None, *, stage_on_host: bool = False) -> TPGroup:
        """The group of an initialised ``torch.distributed`` (the default group, or ``group``)."""
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ShardError("TPGroup.current: torch.distributed is not initialised (call init_process_group first)")
        return cls(dist.get_rank(group), dist.get_world_size(group), group, stage_on_host)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the group, in place (nothing to do for one rank)."""
        if self.world > 1:
            import torch.distributed as dist

            if self.stage_on_host and t.device.type != "cpu":
                host = t.cpu()
                dist.all_reduce(host, group=self.group)
                t.copy_(host)
            else:
                dist.all_reduce(t, group=self.group)
        return t


def _local(shard: Shard, device: str | torch.device | None, dtype: torch.dtype, prefer: Any) -> QuantLinear:
    return QuantLinear(shard.format, shard.tensors, device=device, dtype=dtype, prefer=prefer)


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.local(x))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "relu": torch.relu,
}


class ParallelQuantMLP(nn.Module):
    """A transformer MLP block over a tensor-parallel group: ``down(act(gate(x)) · up(x))``
    (or ``down(act(up(x)))`` without ``gate``), ``gate`` and ``up`` column-parallel, ``down``
    row-parallel, one all-reduce per forward — the pair an engine builds (Megatron's).
    The dims must chain (``up: K → I``, ``down: I → K``) and every cut must be possible,
    which is checked for all layers before anything is prepared. ``act_order="groups"``
    cuts an act-order GPTQ ``down`` by whole groups (its kernels need no replicated
    scales and take even groups) and ``gate``/``up`` by the inputs those groups hold;
    other formats ignore it."""

    def __init__(self, fmt: Format, layers: Mapping[str, Mapping[str, torch.Tensor]], tp: TPGroup, *,
                 activation: str = "silu", act_order: str = "replicate", device: str | torch.device | None = None,
                 dtype: torch.dtype = torch.bfloat16, prefer: str | Sequence[str] | None = None) -> None:
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
        self.tp, self.activation = tp, activation
        self.gate = ColumnParallelQuantLinear(shards["gate"], tp, **kw) if "gate" in shards else None
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

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the intermediate activation."""
        act = ACTIVATIONS[self.activation]
        h = self.up(x)
        return act(self.gate(x)) * h if self.gate is not None else act(h)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's part of the output, before the all-reduce."""
        return self.down.partial(self.hidden(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.partial(x))
