"""RotationLaunch (quantcore/kernels/turboquant/rotation_launch.py): the input rotation of
every pass as a bound Triton launch gives what InputRotation's GEMM gives, in the same
``[M, G, P, d]`` layout: shared and per-group rotations, one and two passes, M on and off
its row tiles. Under the interpreter here (float32: its ``tl.dot`` is right in float32
only); on an sm_90 GPU, bf16 and fp16 through ``tests/hopper_wgmma/test_turboquant_cuda.py``."""

from __future__ import annotations

import pytest
import torch

from quantcore.formats.turboquant import TurboQuant
from quantcore.kernels.turboquant.rotation import InputRotation

from ..interpreting import INTERPRETER, NOT_INTERPRETED

pytestmark = pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)


@pytest.mark.parametrize("fmt", [TurboQuant(group_size=32), TurboQuant(group_size=32, residual=True),
                                 TurboQuant(group_size=32, rotation_per_group=True, residual=True)],
                         ids=lambda f: f.slug)
@pytest.mark.parametrize("m", [1, 16, 17, 70])
def test_the_launch_gives_the_gemms_rotation(fmt: TurboQuant, m: int) -> None:
    from quantcore.kernels.turboquant.rotation_launch import RotationLaunch

    k = 96
    gen = torch.Generator().manual_seed(m)
    stored = fmt.quantize(torch.randn(8, k, generator=gen), generator=gen)
    # P = Πᵀ, as the kernels keep them (transforms/turboquant_passes.py)
    rotation = InputRotation([stored[p + "rotation"].transpose(-1, -2).contiguous() for p in fmt.passes])
    x = torch.randn(m, k, generator=gen)
    got = RotationLaunch(rotation, k, x.device)(x)
    want = rotation(x)
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
