"""16 threads selecting and preparing on shared weights: one prepare per weight, no race,
the same results as one thread."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from quantcore.binding import bind
from quantcore.formats.gptq import GPTQ
from quantcore.problem import Problem
from quantcore.registry import Registry
from quantcore.selection import get_kernel

from ..core.fakes import Plugin, dense_kernel

THREADS = 16
FMT = GPTQ(group_size=32, sym=False, desc_act=True)
P = Problem.linear(FMT, M=3, K=256, N=64, dtype=torch.float32)


def counting_kernel(counter: list[int], lock: threading.Lock) -> type:
    k = dense_kernel("counted", priority=1000)
    inner = k.prepare

    def prepare(self: Any, tensors: Any, *, dtype: Any = None) -> Any:
        with lock:
            counter[0] += 1
        time.sleep(0.01)  # widen the window a racy cache would fall into
        return inner(self, tensors, dtype=dtype)

    k.prepare = prepare
    return k


def test_one_prepare_per_weight_under_16_threads(registry: Registry) -> None:
    counter, lock = [0], threading.Lock()
    registry.register(Plugin(counting_kernel(counter, lock)), name="counted")
    gen = torch.Generator().manual_seed(0)
    weights = [FMT.quantize(torch.randn(64, 256, generator=gen), generator=gen) for _ in range(3)]
    x = torch.randn(3, 256, generator=gen)
    barrier = threading.Barrier(THREADS)

    def work(i: int) -> tuple[str, list[torch.Tensor], list[int]]:
        barrier.wait()
        k = get_kernel(FMT, "cpu", problem=P, registry=registry)
        bound = [bind(FMT, "cpu", w, problem=P, registry=registry) for w in weights]
        return k.name, [b(x) for b in bound], [id(b) for b in bound]

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(work, range(THREADS)))
    assert counter[0] == len(weights)
    assert {name for name, _, _ in results} == {"counted"}
    assert len({tuple(ids) for _, _, ids in results}) == 1
    first = results[0][1]
    for _, outs, _ in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs, first, strict=True))
    for w, y in zip(weights, first, strict=True):
        ref = x.double() @ FMT.dequantize(w).T
        assert (y.double() - ref).norm() / ref.norm() < 1e-5


def test_registry_loads_once_under_threads() -> None:
    reg = Registry()
    with ThreadPoolExecutor(THREADS) as pool:
        kernels = list(pool.map(lambda _: get_kernel("gptq", "cpu", problem=P, registry=reg), range(THREADS)))
    assert len({id(k) for k in kernels}) <= 2  # a lost cache write may build a second, equal one
    assert {k.name for k in kernels} == {"aten_cpu"} or {k.name for k in kernels} == {kernels[0].name}
    names = [p.name for p in reg.plugins()]
    assert len(names) == len(set(names))


def test_bound_state_dies_with_its_last_user(registry: Registry) -> None:
    import gc
    import weakref

    from quantcore import binding

    gen = torch.Generator().manual_seed(9)
    w = FMT.quantize(torch.randn(64, 256, generator=gen), generator=gen)
    bound = bind(FMT, "cpu", w, problem=P, registry=registry)
    assert bind(FMT, "cpu", w, problem=P, registry=registry) is bound
    qweight = weakref.ref(w["qweight"])
    (key,) = [k for k, ref in binding._bound.items() if ref() is bound]
    del w, bound
    gc.collect()
    assert qweight() is None and key not in binding._bound
