"""How one checkpoint names its quantized linears, which format each has, and how their
tensors reach a kernel — the part of loading that differs between the tools' layouts.

* GPTQ / AWQ (:class:`SingleFormatScheme`): a layer is ``<prefix>.qweight`` with
  ``qzeros``, ``scales``, ``g_idx``; one format for every layer; GPTQ v1 zero points
  read by their writer's rule (:mod:`.producer`).
* compressed-tensors (:class:`CompressedScheme`): a layer is ``<prefix>.weight_packed``
  with ``weight_scale``, ``weight_zero_point``, ``weight_shape``, ``weight_g_idx``; each
  layer's scheme is its config group's (:mod:`.compressed`); the tensors reach the GPTQ
  kernels through :class:`~quantcore.transforms.compressed_gptq.CompressedToGPTQ`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import ClassVar

import torch
from torch import nn

from ..errors import TensorFormatError
from ..formats.awq import AWQ
from ..formats.base import Format
from ..formats.compressed_tensors import CompressedTensors
from ..formats.compressed_tensors.format import TENSOR_NAMES as COMPRESSED_TENSORS
from ..formats.gptq import GPTQ
from ..transforms.compressed_gptq import CompressedToGPTQ
from .compressed import CompressedConfig
from .producer import V1Reader

__all__ = ["GPTQ_TENSORS", "CheckpointScheme", "CompressedScheme", "SingleFormatScheme", "check_against_config"]

#: The tensors of a GPTQ / AWQ linear, by leaf name.
GPTQ_TENSORS = ("qweight", "qzeros", "scales", "g_idx", "bias")


def _implied(what: str, expected: object, prefix: str, detail: str) -> TensorFormatError:
    return TensorFormatError(f"{prefix}: the config says {what}={expected}, but {detail}")


def check_against_config(fmt: Format, prefix: str, t: dict[str, torch.Tensor]) -> None:
    """Config/tensor disagreements, said in the config's terms (bits, group_size)."""
    qweight, scales = t.get("qweight"), t.get("scales")
    if not isinstance(qweight, torch.Tensor) or not isinstance(scales, torch.Tensor) or qweight.dim() != 2 \
            or scales.dim() != 2 or qweight.is_floating_point() or qweight.is_complex() or qweight.dtype == torch.bool \
            or 0 in qweight.shape or 0 in scales.shape:
        return  # validate() names what is missing, misshapen, empty or of the wrong dtype
    if isinstance(fmt, GPTQ) and isinstance(t.get("g_idx"), torch.Tensor) and t["g_idx"].numel():
        in_features = t["g_idx"].numel()
        lanes_bits = qweight.shape[0] * torch.iinfo(qweight.dtype).bits
        if lanes_bits != in_features * fmt.bits:
            raise _implied(
                "bits", fmt.bits, prefix,
                f"{prefix}.qweight has {qweight.shape[0]} rows of {qweight.dtype} for {in_features} inputs "
                f"({prefix}.g_idx), i.e. {lanes_bits / in_features:g} bits per input",
            )
    elif isinstance(fmt, AWQ):
        in_features = qweight.shape[0]
        if qweight.shape[1] * 32 != scales.shape[1] * fmt.bits:
            raise _implied(
                "bits", fmt.bits, prefix,
                f"{prefix}.qweight packs {scales.shape[1]} outputs ({prefix}.scales) into {qweight.shape[1]} "
                f"int32 lanes, i.e. {qweight.shape[1] * 32 / scales.shape[1]:g} bits per output",
            )
    else:
        return
    gs = getattr(fmt, "group_size", -1)
    groups = scales.shape[0]
    expected = 1 if gs == -1 else in_features // gs if in_features % gs == 0 else None
    if expected is None:
        raise _implied("group_size", gs, prefix, f"it does not divide in_features={in_features}")
    if groups != expected:
        raise _implied(
            "group_size", gs, prefix,
            f"{prefix}.scales has {groups} groups for {in_features} inputs (group_size {in_features / groups:g})",
        )



class CheckpointScheme(ABC):
    #: The tensor whose presence marks a quantized linear: ``<prefix>.<marker>``.
    marker: ClassVar[str]
    #: Every leaf name a quantized linear's tensors may have.
    leaves: ClassVar[tuple[str, ...]]

    def __init__(self, source: str) -> None:
        #: The config file, for messages.
        self.source = source

    def layers(self, names: Iterable[str]) -> list[str]:
        """The quantized linears among a checkpoint's tensor names, sorted."""
        suffix = "." + self.marker
        return sorted(n[: -len(suffix)] for n in names if n.endswith(suffix))

    @abstractmethod
    def format_for(self, layer: str, module: nn.Module | None = None) -> Format:
        """The format the config gives ``layer``; refuses a layer it does not quantize."""

    def expects_quantized(self, layer: str, module: nn.Module) -> bool:
        """Whether the config says ``layer`` is stored quantized (checked against the files)."""
        return False

    def survey(self, layer: str, read: Callable[[str], torch.Tensor]) -> None:
        """A look at one layer before anything is prepared (``read(leaf)`` loads a tensor)."""
        return None

    def decide(self) -> None:
        """Refuse the checkpoint if the survey found it ambiguous."""
        return None

    def check(self, layer: str, tensors: dict[str, torch.Tensor], module: nn.Module | None = None) -> dict[str, int]:
        """Validate one layer's tensors against its format; the problem dims they imply."""
        return self.format_for(layer, module).validate(tensors)

    @abstractmethod
    def to_kernel(self, layer: str, tensors: dict[str, torch.Tensor],
                  module: nn.Module | None = None) -> tuple[Format, dict[str, torch.Tensor]]:
        """The format and tensors a :class:`~quantcore.nn.linear.QuantLinear` takes."""


class SingleFormatScheme(CheckpointScheme):
    """GPTQ and AWQ: one format for every layer."""

    marker = "qweight"
    leaves = GPTQ_TENSORS

    def __init__(self, fmt: Format, reader: V1Reader) -> None:
        super().__init__(reader.source)
        self.fmt, self.reader = fmt, reader

    def format_for(self, layer: str, module: nn.Module | None = None) -> Format:
        return self.fmt

    def survey(self, layer: str, read: Callable[[str], torch.Tensor]) -> None:
        if self.reader.needs_survey:
            self.reader.survey(layer, read("qzeros"))

    def decide(self) -> None:
        self.reader.decide()

    def check(self, layer: str, tensors: dict[str, torch.Tensor], module: nn.Module | None = None) -> dict[str, int]:
        check_against_config(self.fmt, layer, tensors)
        return self.fmt.validate(tensors)

    def to_kernel(self, layer: str, tensors: dict[str, torch.Tensor],
                  module: nn.Module | None = None) -> tuple[Format, dict[str, torch.Tensor]]:
        return self.reader.read(layer, tensors)


class CompressedScheme(CheckpointScheme):
    """compressed-tensors pack-quantized: each layer's format from its config group."""

    marker = "weight_packed"
    leaves = COMPRESSED_TENSORS

    def __init__(self, config: CompressedConfig, source: str) -> None:
        super().__init__(source)
        self.config = config

    def format_for(self, layer: str, module: nn.Module | None = None) -> CompressedTensors:
        fmt = self.config.format_for(layer, module)
        if fmt is None:
            why = "'ignore' names it" if self.config.ignored(layer, module) else "no config group targets it"
            raise TensorFormatError(
                f"{layer}.weight_packed: the layer is stored pack-quantized, but the config does not quantize it "
                f"({why}); expected a config group whose targets name it"
            )
        return fmt

    def expects_quantized(self, layer: str, module: nn.Module) -> bool:
        return isinstance(module, nn.Linear) and self.config.format_for(layer, module) is not None

    def check(self, layer: str, tensors: dict[str, torch.Tensor], module: nn.Module | None = None) -> dict[str, int]:
        fmt = self.format_for(layer, module)
        packed, shape = tensors.get("weight_packed"), tensors.get("weight_shape")
        if packed is not None and shape is not None and packed.dim() == 2 and shape.numel() == 2:
            in_features = int(shape[1])
            if in_features and packed.shape[1] * 32 != in_features * fmt.bits:
                raise TensorFormatError(
                    f"{layer}.weight_packed: the config says num_bits={fmt.bits}, but it holds {packed.shape[1]} int32 "
                    f"per row for in_features={in_features} (weight_shape), i.e. "
                    f"{packed.shape[1] * 32 / in_features:g} bits per input"
                )
        return fmt.validate(tensors)

    def to_kernel(self, layer: str, tensors: dict[str, torch.Tensor],
                  module: nn.Module | None = None) -> tuple[Format, dict[str, torch.Tensor]]:
        transform = CompressedToGPTQ(self.format_for(layer, module))
        return transform.target, transform.apply(tensors)
