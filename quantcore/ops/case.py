"""A case: format parameters × op shape × activation dtype × seed — what the conformance
matrix, tuning and the fuzz draw weights, inputs and golden outputs from (through the op's
harness, :mod:`quantcore.ops.harness`)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from quantcore.dtypes import dtype_name
from quantcore.formats.base import Format
from quantcore.problem import Problem

__all__ = ["PROFILES", "Case"]

#: ``ci`` runs on every push (CPU, bounded time); ``full`` adds what a device lane runs.
PROFILES = ("ci", "full")


@dataclass(frozen=True)
class Case:
    format: Format
    dims: tuple[tuple[str, int], ...]
    act_dtype: torch.dtype
    seed: int = 0
    #: Op-specific switches (``("bias", True)``); part of the id when set.
    options: tuple[tuple[str, object], ...] = ()
    #: The smallest profile that includes this case.
    profile: str = "ci"
    #: Cases that share weights (same format, same weight dims, same seed) share a key,
    #: so the golden quantization runs once for all their M and dtypes.
    weight_dims: tuple[str, ...] = ("K", "N")
    problem: Problem = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile: expected one of {PROFILES}, got {self.profile!r}")
        object.__setattr__(self, "problem", Problem.of(self.format, dict(self.dims), self.act_dtype))

    @property
    def op(self) -> str:
        return self.problem.op

    def option(self, name: str, default: object = None) -> object:
        return dict(self.options).get(name, default)

    @property
    def shape_id(self) -> str:
        extra = "".join(f"+{k}" if v is True else f"+{k}{v}" for k, v in self.options if v)
        return self.problem.shape_id() + extra

    @property
    def id(self) -> str:
        """``gptq4-g128-asym/M1-K4096-N4096/bf16`` (the backend goes after the format)."""
        return f"{self.format.slug}/{self.shape_id}/{dtype_name(self.act_dtype)}"

    def cell_id(self, kernel: str) -> str:
        return f"{self.format.slug}/{kernel}/{self.shape_id}/{dtype_name(self.act_dtype)}"

    @property
    def seed_key(self) -> str:
        """What the weights' random draw is seeded from: format, weight dims and seed."""
        dims = dict(self.dims)
        shape = "-".join(f"{d}{dims[d]}" for d in self.weight_dims if d in dims)
        return f"{self.format.slug}/{shape}/s{self.seed}"

    @property
    def weight_key(self) -> str:
        """Cases whose weights are the same share it: the seed key and the options that add
        to the weights (a linear's bias: the harness's ``weight_options``). A case without
        the bias must never be judged against weights drawn for the case with it."""
        from .kinds import get_op  # the op kinds import this module

        adds = get_op(self.op).harness.weight_options
        return self.seed_key + "".join(f"+{k}" for k, v in self.options if v and k in adds)

    def generator(self, salt: str) -> torch.Generator:
        """Deterministic per (case part, seed): the same case draws the same tensors on
        every worker, and different cases draw different ones."""
        return torch.Generator().manual_seed(zlib.crc32(f"{salt}/{self.seed}".encode()))
