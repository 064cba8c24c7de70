"""``gated_activation(h, activation)``: ``act(h[..., :I]) · h[..., I:]`` for the ``[..., 2·I]``
output of a fused gate/up layer, in one launch on CUDA.

Rounding (the contract on every device, torch's ``act(g) * u`` in the input dtype): the
activation is computed in float32 from ``g`` and rounded to the dtype; the product is
computed in float32 from the two dtype values and rounded to the dtype. (For bf16 and fp16
that product is exact in float32, so it is rounded once.) The formulas are torch's:
``silu(g) = g / (1 + exp(−g))``, ``gelu(g) = g · 0.5 · (1 + erf(g · √½))`` (the erf form,
torch's default), ``relu(g) = max(g, 0)`` with NaN kept. Where the kernel runs, ``exp`` and
``erf`` are its own: on a GPU the libdevice build Triton bundles (not necessarily the one
torch's kernels were compiled with); under Triton's interpreter NumPy's. float64 runs torch's ops, in float64, on every device.

Routes. On CUDA, eagerly, for silu and relu in bf16/fp16/fp32, one Triton launch (:mod:`.triton_launch`),
bound once per (activation, I, dtype, device); the output comes from ``torch.empty`` and
nothing syncs with the host, so a CUDA graph can capture it (after a first call outside the
capture has compiled it). While traced (:func:`quantcore.tensors.traced`: ``torch.compile``,
``torch.export``, fake tensors) torch's ops, which inductor fuses itself; likewise on any
other device and where Triton cannot run (:func:`why_torch` says why). gelu runs torch's
ops on CUDA too: on an H200 the kernel's gelu was up to 128 units in the last place from
torch's CUDA gelu for gates far in the negative tail (values near 1e-8, where ``1 + erf``
cancels and a contracted multiply-add moves the result), while silu stayed within one unit
and relu was bit for bit (``tests/gated_activation/test_cuda.py``). The kernel keeps its gelu
(the interpreter tests hold it to the contract) until it matches there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import torch

from ...errors import InvalidArgumentError, KernelInputError
from ...kernel import Requirements
from ...probe import probe
from ...tensors import describe, traced
from ...triton import TESTED_TRITON

__all__ = ["ACTIVATIONS", "KERNEL_ACTIVATIONS", "KERNEL_DTYPES", "check_gated", "gated_activation", "why_torch"]

#: The activations by name, as the ops they call: ``F.silu`` without its Python wrapper
#: (which only adds the ``inplace`` choice; ``F.gelu`` is its op already).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": torch._C._nn.silu,
    "gelu": torch.nn.functional.gelu,
    "relu": torch.relu,
}

#: The activations the kernel runs on a GPU (module docstring: why not gelu).
KERNEL_ACTIVATIONS = frozenset({"silu", "relu"})
#: The dtypes the kernel takes; float64 is taken too and runs torch's ops everywhere.
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_DTYPES = (*KERNEL_DTYPES, torch.float64)
_DTYPE_NAMES = "bf16/fp16/fp32/fp64"

Runner = Callable[[torch.Tensor, str], torch.Tensor]

#: Per CUDA device: the kernel's runner (None where torch's ops run) and why not.
_runners: dict[torch.device, Runner | None] = {}
_why: dict[torch.device, str] = {}
_lock = threading.Lock()
_UNSET = object()


def check_gated(h: object, activation: object) -> int:
    """``I`` for a call the op takes: ``h`` a ``[..., 2·I]`` bf16/fp16/fp32/fp64 tensor,
    unit-strided along its last dim, whose leading dims read as rows at one stride (so the
    kernel can take it as ``[M, 2·I]``), and ``activation`` a name in :data:`ACTIVATIONS`.
    Else a :class:`~quantcore.errors.QuantCoreError` naming the parameter, what was
    expected and what came."""
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise InvalidArgumentError(f"gated_activation activation: expected one of {sorted(ACTIVATIONS)}, "
                                   f"got {activation!r}")
    wanted = f"a [..., 2·I] {_DTYPE_NAMES} tensor (gate then up)"
    if not isinstance(h, torch.Tensor):
        raise KernelInputError(f"gated_activation h: expected {wanted}, got {type(h).__name__}")
    if h.dim() < 1 or h.dtype not in _DTYPES:
        raise KernelInputError(f"gated_activation h: expected {wanted}, got {describe(h)}")
    if h.shape[-1] % 2:
        raise KernelInputError(f"gated_activation h: expected an even last dim (gate then up, I each), "
                               f"got {describe(h)}")
    if h.shape[-1] and h.stride(-1) != 1:
        raise KernelInputError(f"gated_activation h: expected unit stride along the last dim, got {describe(h)} "
                               f"with strides {tuple(h.stride())}")
    if h.dim() > 2:
        try:
            h.view(-1, h.shape[-1])
        except RuntimeError:
            raise KernelInputError(f"gated_activation h: expected leading dims that read as rows at one stride, "
                                   f"got {describe(h)} with strides {tuple(h.stride())}") from None
    return h.shape[-1] // 2


def gated_activation(h: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """``act(h[..., :I]) · h[..., I:]``, shape ``[..., I]``, in ``h``'s dtype, for ``h =
    [..., 2·I]`` laid out as a fused gate/up layer writes it: gate first, then up.
    ``activation``: ``"silu"``, ``"gelu"`` (erf) or ``"relu"``. Rounded as torch's
    ``act(g) * u`` is (module docstring); one Triton launch on CUDA for silu and relu."""
    act = ACTIVATIONS.get(activation) if type(activation) is str else None
    if act is None or not (isinstance(h, torch.Tensor) and h.dim() and h.dtype in _DTYPES
                           and not h.shape[-1] % 2 and (h.stride(-1) == 1 or not h.shape[-1])
                           and (h.dim() <= 2 or h.is_contiguous())):
        check_gated(h, activation)  # raises, unless only the leading dims' strides were unusual
        act = ACTIVATIONS[activation]
    if h.is_cuda and h.dtype in KERNEL_DTYPES and activation in KERNEL_ACTIVATIONS and not traced(h):
        run = _runners.get(h.device, _UNSET)
        if run is _UNSET:
            run = _runner(h.device)
        if run is not None:
            return run(h, activation)  # type: ignore[operator]
    inter = h.shape[-1] // 2
    gate, up = h.split_with_sizes((inter, inter), dim=-1)
    return act(gate) * up


def why_torch(device: torch.device | str) -> str:
    """Why ``gated_activation`` runs torch's ops on ``device`` eagerly ("" where the kernel
    runs: a CUDA device with a usable triton, the interpreter off)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"the kernel runs on CUDA devices, not {device.type}"
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    _runner(device)
    return _why[device]


def _runner(device: torch.device) -> Runner | None:
    """The kernel's runner on ``device``, decided once: None where Triton cannot run."""
    with _lock:
        if device in _runners:
            return _runners[device]
        why, run = _unusable(device), None
        if not why:
            try:
                from . import triton_launch
            except ImportError as exc:  # a broken triton install: torch's ops still answer
                why = f"importing the kernel failed: {type(exc).__name__}: {exc}"
            else:
                run = triton_launch.run
        _why[device], _runners[device] = why, run
        return run


#: What the kernel needs of a CUDA device (the Triton kernels' floor, quantcore/triton/__init__.py).
_KERNEL_NEEDS = Requirements(device_types=frozenset({"cuda"}), packages=("triton",), min_versions=(TESTED_TRITON,))


def _unusable(device: torch.device) -> str:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "Triton's interpreter is on (TRITON_INTERPRET=1): it runs kernels on the CPU, not on this device"
    return _KERNEL_NEEDS.check(probe(device)) or ""
