"""One exception family for the package.

Every message names the tensor or parameter at fault, what was expected and what came,
so a user can fix the input without reading our source.
"""

from __future__ import annotations

__all__ = [
    "FusionError",
    "InvalidArgumentError",
    "KernelInputError",
    "MissingDependencyError",
    "NoKernelError",
    "PluginError",
    "QuantCoreError",
    "QuantCoreWarning",
    "ShardError",
    "TensorFormatError",
    "UnknownFormatError",
    "UnsupportedProblemError",
]


class QuantCoreError(Exception):
    """Root of every error quantcore raises on purpose."""


class QuantCoreWarning(UserWarning):
    """Something quantcore did that the user should know about: a layer left dense, a
    checkpoint read under an assumption."""


class TensorFormatError(QuantCoreError, ValueError):
    """A format's tensors (a checkpoint's qweight, scales, ...) are malformed."""


class KernelInputError(QuantCoreError, ValueError):
    """A kernel was called with an activation or prepared state it cannot take."""


class UnsupportedProblemError(QuantCoreError, ValueError):
    """A kernel was asked to prepare or run a problem its ``supports()`` refuses."""


class InvalidArgumentError(QuantCoreError, ValueError):
    """An argument quantcore cannot read: a device string, a dtype name, arguments that
    contradict each other."""


class ShardError(InvalidArgumentError):
    """A tensor-parallel split that cannot be made: a world size that does not divide, a
    rank out of range, a cut inside a packed lane or a quantization group, shards of one
    layer that disagree. Raised before any collective, on every rank alike."""


class FusionError(InvalidArgumentError):
    """Layers that cannot become one along N: formats, group sizes, bits, ``g_idx``,
    rotations, devices or activation dtypes that differ, or a format without a
    concatenation. The message names the layers and what differs."""


class MissingDependencyError(QuantCoreError, ImportError):
    """A package quantcore needs for this call is absent, or its version lacks what is
    needed; the message names the package, its version and what is missing."""


class UnknownFormatError(QuantCoreError, LookupError):
    """No registered format has this name."""


class PluginError(QuantCoreError):
    """A plugin broke a registry rule (wrong hook return type, duplicate name, ...)."""


class NoKernelError(QuantCoreError, RuntimeError):
    """No registered kernel can run the request; the message is the explain table."""

    def __init__(self, message: str, explanation: object | None = None) -> None:
        super().__init__(message)
        self.explanation = explanation
