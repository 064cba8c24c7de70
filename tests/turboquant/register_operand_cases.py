"""The layers, rotation routes and plans the register-operand tests run the tensor-core
kernel over under the interpreter (``test_triton_mma_register_operand.py``,
``test_triton_mma_scaled_operand.py``): every kind of TurboQuant layer at the smallest
group size with a register operand."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from quantcore.formats.turboquant import TurboQuant

K, N, D = 256, 64, 64  # 4 groups of the smallest size with a register operand
LAYERS = {
    "one-pass": (TurboQuant(group_size=D), False),
    "own-rotations": (TurboQuant(group_size=D, residual=True), False),
    "shared-rotation": (TurboQuant(group_size=D, residual=True), True),
    "per-group": (TurboQuant(group_size=D, rotation_per_group=True, residual=True), False),
}
#: Where x is rotated, per layer (a rotation per group: always outside).
ROUTES = {"one-pass": ("outside", "kernel", "once"), "own-rotations": ("outside", "kernel", "once"),
          "shared-rotation": ("outside", "once"), "per-group": ("outside",)}
#: (groups a program, bias, partial): one split; 2 splits of 3 and 1 groups.
PLANS = [(4, True, False), (3, False, True)]


def layer(name: str, seed: int, dtype: torch.dtype = torch.bfloat16,
          d: int = D) -> tuple[TurboQuant, dict[str, torch.Tensor], Any]:
    """(format, stored tensors with a bias, the ``turboquant_triton`` prepared state) of
    layer ``name`` from fresh random weights; the shared-rotation layer's passes share one."""
    from quantcore.backends.turboquant_triton import TurboQuantTriton

    fmt, shared = LAYERS[name]
    fmt = dataclasses.replace(fmt, group_size=d)
    gen = torch.Generator().manual_seed(seed)
    t = fmt.quantize(torch.randn(N, K, generator=gen) * 0.05, generator=gen)
    t["bias"] = torch.randn(N, generator=gen)
    if shared:
        t["residual_rotation"] = t["rotation"].clone()
    prep = TurboQuantTriton(fmt, "cpu").prepare(t, dtype=dtype)
    if shared:
        p1, p2 = prep.passes
        prep = dataclasses.replace(prep, passes=(p1, dataclasses.replace(p2, rotation=p1.rotation)))
    return fmt, t, prep


def exact_layer(prep: Any, gen: torch.Generator, dtype: torch.dtype, *, power_of_two_scales: bool = False) -> Any:
    """``prep`` with a dyadic codebook (k/4 − 2, distinct, exact in 16 bits) and signed
    permutations for rotations (in ``dtype``): with integer activations every product and
    partial sum of a group is exact in float32, whatever its order. With
    ``power_of_two_scales`` the scales become 2⁻³ … 2¹ too: every c · s then has at most 4
    significant bits (exact in 16 bits) and every sum over groups is exact as well."""
    codebook = prep.codebook.clone()
    codebook[:16] = (torch.randperm(16, generator=gen).float() / 4 - 2)
    rotations = {}
    passes = []
    for p in prep.passes:
        key = id(p.rotation)
        if key not in rotations:
            r, d, _ = p.rotation.shape
            pi = torch.zeros(r, d, d)
            for i in range(r):
                signs = torch.randint(0, 2, (d,), generator=gen).float() * 2 - 1
                pi[i, torch.arange(d), torch.randperm(d, generator=gen)] = signs
            rotations[key] = pi.to(dtype)
        changed: dict[str, torch.Tensor] = {"rotation": rotations[key]}
        if power_of_two_scales:
            changed["scales"] = 2.0 ** torch.randint(-3, 2, p.scales.shape, generator=gen).float()
        passes.append(dataclasses.replace(p, **changed))
    return dataclasses.replace(prep, codebook=codebook, passes=tuple(passes))
