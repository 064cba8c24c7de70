"""The cases the tensor-parallel matrix cuts: every format family, each at a shape whose
cuts fall on its boundaries for world 2 and 4 along every dim it has (K = 512 holds four
groups of 128; N = 256 four runs of 64 outputs, whole lanes at every bit width).

GPTQ covers 2/3/4/8 bits, v1 and v2, act-order (with and without static groups), one
group over all inputs, and the narrow and wide pack dtypes; AWQ its group sizes and
zero-point modes; TurboQuant the residual pass, per-group rotations and the 2/3-bit
codebooks; trtllm_moe both group sizes, sym/asym, the weighted sum and per-route inputs;
SVDQuant's pre-GEMM both formats, with and without smooth. ``full`` adds the large
shapes a device lane runs.
"""

from __future__ import annotations

import itertools

import torch

from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.formats.turboquant import TurboQuant

from ..case import Case

__all__ = ["WORLDS", "tp_cases"]

#: The world sizes every case is cut into.
WORLDS = (2, 4)
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def _linear(fmt: object, m: int, k: int, n: int, dtype: torch.dtype, profile: str = "ci") -> Case:
    return Case(fmt, (("M", m), ("K", k), ("N", n)), dtype, options=(("bias", True),), profile=profile)  # type: ignore[arg-type]


def _gptq() -> list[Case]:
    formats = [
        GPTQ(bits=4, group_size=128, sym=True),
        GPTQ(bits=4, group_size=128, sym=False, desc_act=True),
        GPTQ(bits=4, group_size=128, sym=False, checkpoint_format="v1"),
        GPTQ(bits=4, group_size=-1, sym=False, desc_act=True),
        GPTQ(bits=4, group_size=32, sym=False, desc_act=True, static_groups=True),
        GPTQ(bits=2, group_size=128, sym=False, desc_act=True),
        GPTQ(bits=3, group_size=128, sym=False, checkpoint_format="v1"),
        GPTQ(bits=3, group_size=32, sym=True, desc_act=True),
        GPTQ(bits=8, group_size=128, sym=True, desc_act=True),
        GPTQ(bits=8, group_size=-1, sym=False),
        GPTQ(bits=4, group_size=64, sym=False, pack_dtype=torch.int16),
        GPTQ(bits=2, group_size=64, sym=True, pack_dtype=torch.int8),
        GPTQ(bits=8, group_size=64, sym=False, desc_act=True, pack_dtype=torch.int64),
    ]
    cases = [_linear(f, 5, 512, 256, BF16) for f in formats]
    for f, dtype in itertools.product(formats[:2], (FP16, FP32)):
        cases.append(_linear(f, 3, 512, 256, dtype))
    for f in formats[:2]:
        cases.append(_linear(f, 16, 4096, 4096, BF16, "full"))
    return cases


def _awq() -> list[Case]:
    formats = [AWQ(group_size=128), AWQ(group_size=32, zero_point=False), AWQ(group_size=-1)]
    cases = [_linear(f, 5, 512, 256, BF16) for f in formats]
    cases += [_linear(formats[0], 3, 512, 256, d) for d in (FP16, FP32)]
    cases.append(_linear(formats[0], 16, 4096, 4096, BF16, "full"))
    return cases


def _turboquant() -> list[Case]:
    formats = [
        TurboQuant(),
        TurboQuant(residual=True),
        TurboQuant(group_size=64, residual=True, rotation_per_group=True),
        TurboQuant(bits=3, group_size=64),
        TurboQuant(bits=2, residual=True, norm_dtype=torch.bfloat16),
    ]
    cases = [_linear(f, 3, 512, 96, BF16) for f in formats]
    cases.append(_linear(formats[1], 5, 512, 96, FP16))
    cases.append(_linear(formats[1], 16, 4096, 4096, BF16, "full"))
    return cases


def _moe(fmt: TRTLLMMoE, t: int, k: int, n: int, option: str = "", profile: str = "ci") -> Case:
    dims = (("T", t), ("E", 8), ("topk", 2), ("K", k), ("N", n))
    options = ((option, True),) if option else ()
    return Case(fmt, dims, fmt.scale_dtype, options=options, profile=profile, weight_dims=("E", "K", "N"))


def _trtllm_moe() -> list[Case]:
    g64 = TRTLLMMoE(group_size=64, sym=True, scale_dtype=FP16)
    g64a = TRTLLMMoE(group_size=64, sym=False, scale_dtype=BF16)
    g128 = TRTLLMMoE(group_size=128, sym=True, scale_dtype=BF16)
    return [
        _moe(g64, 5, 256, 128), _moe(g64a, 5, 256, 128, "per_route"), _moe(g128, 5, 512, 128, "weighted"),
        _moe(g64a, 64, 256, 128, profile="full"), _moe(g128, 64, 4096, 4096, profile="full"),
    ]


def _svdquant() -> list[Case]:
    cases = []
    for fp4, smooth in itertools.product((True, False), (False, True)):
        options = (("smooth", True),) if smooth else ()
        cases.append(Case(SVDQuantAct(fp4=fp4), (("M", 5), ("N", 256), ("R", 16)), BF16 if fp4 else FP16,
                          seed=int(smooth), options=options, weight_dims=("N", "R")))
    return cases


def tp_cases() -> list[Case]:
    return [*_gptq(), *_awq(), *_turboquant(), *_trtllm_moe(), *_svdquant()]
