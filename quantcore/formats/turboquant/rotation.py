"""Random rotations: Haar-distributed orthogonal matrices, as the paper draws them.

QR of a d × d matrix of i.i.d. N(0, 1) entries, with the signs of R's diagonal moved
into Q so the result is uniform over the orthogonal group (Mezzadri 2007) rather than
biased by the QR routine's sign convention. Drawn in float64 from the caller's
generator; the checkpoint stores the result (see ``format.py`` for why), so the draw
only has to be random, not reproducible across torch versions.
"""

from __future__ import annotations

import torch

__all__ = ["random_rotation"]


def random_rotation(
    d: int, count: int = 1, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``count`` independent Haar-random orthogonal ``d × d`` matrices, float64 ``[count, d, d]``."""
    if d < 1 or count < 1:
        raise ValueError(f"random_rotation: expected d >= 1 and count >= 1, got d={d}, count={count}")
    gauss = torch.randn(count, d, d, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gauss)
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    signs[signs == 0] = 1.0
    return q * signs.unsqueeze(-2)
