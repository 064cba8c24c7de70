"""16 threads selecting and preparing on shared weights: one prepare per weight, no race,
the same results as one thread."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from quantcore.binding import bind
from quantcore.errors import QuantCoreError
from quantcore.formats.gptq import GPTQ
from quantcore.problem import Problem
from quantcore.registry import KernelEntry, Registry
from quantcore.selection import explain, get_kernel
from quantcore.selection.state import selection_state

from ..core.fakes import Plugin, dense_kernel
from .fuzz.op_oracles import oracle_for
from .fuzz.seeds import runnable_kernels, seed_tensors, seeds_for
from .fuzz.state import differences

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

    def work(i: int) -> tuple[str, list[torch.Tensor], list[Any]]:
        barrier.wait()
        k = get_kernel(FMT, "cpu", problem=P, registry=registry)
        bound = [bind(FMT, "cpu", w, problem=P, registry=registry) for w in weights]
        # Returned, so every bound kernel outlives all threads: one shared prepare is
        # promised for as long as someone holds the result (a thread that dropped its
        # reference before a slow thread arrived would let that one prepare again).
        return k.name, [b(x) for b in bound], bound

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(work, range(THREADS)))
    assert counter[0] == len(weights)
    assert {name for name, _, _ in results} == {"counted"}
    assert len({tuple(map(id, bound)) for _, _, bound in results}) == 1
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
    assert len({id(k) for k in kernels}) == 1  # threads that select at once share the first
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


# --- every real kernel, and faults, under 16 threads ------------------------------------------

REAL = [e for e in runnable_kernels("cpu") if oracle_for(e.cls.op) and "triton" not in e.cls.requires.packages
        and any(e.cls.supports(c.problem) for c in seeds_for(e.cls.format, e.cls.op))]


class _Draws:
    """Fixed draws for an oracle's nominal inputs, outside hypothesis."""

    def __init__(self, seed: int) -> None:
        self.rng = __import__("random").Random(seed)

    def draw(self, strategy: Any, label: str = "") -> Any:
        if label in ("M", "T"):
            return 3
        if label in ("topk",):
            return 1
        if label in ("per_route", "weighted"):
            return False
        return self.rng.randrange(2**31)


def same_output(a: Any, b: Any) -> bool:
    """Bit-equal outputs: one tensor, or a tuple of them (an op with several outputs)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_output(x, y) for x, y in zip(a, b, strict=True))
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)


@pytest.mark.parametrize("entry", REAL, ids=lambda e: f"{e.cls.format}/{e.cls.name}")
def test_real_kernel_shared_weights_under_16_threads(entry: KernelEntry, registry: Registry) -> None:
    """16 threads select, prepare the same stored tensors and call with mixed activation
    dtypes: identical prepared states, identical outputs per dtype, correct outputs, and
    the shared tensors untouched."""
    oracle = oracle_for(entry.cls.op)
    assert oracle is not None
    case = next(c for c in seeds_for(entry.cls.format, entry.cls.op) if entry.cls.supports(c.problem))
    shared = seed_tensors(case)
    before = {k: v.clone() for k, v in shared.items()}
    dims = case.format.validate(shared)
    dtypes = [case.act_dtype, *(d for d in (torch.bfloat16, torch.float16, torch.float32) if d != case.act_dtype)]
    inputs = [oracle.nominal(_Draws(i), dims, d) for i, d in enumerate(dtypes)]  # type: ignore[arg-type]
    barrier = threading.Barrier(THREADS)

    def work(i: int) -> tuple[Any, list[Any]]:
        barrier.wait()
        get_kernel(case.format, "cpu", problem=case.problem, registry=registry)
        kernel = entry.cls(case.format, torch.device("cpu"))
        prepared = kernel.prepare(shared)
        outs = []
        for j in range(len(inputs)):
            try:
                outs.append(oracle.call(kernel, prepared, inputs[(i + j) % len(inputs)]))
            except QuantCoreError:
                outs.append(None)
        return prepared, [outs[(j - i) % len(inputs)] for j in range(len(inputs))]

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(work, range(THREADS)))
    first_state, first_outs = results[0]
    for state, outs in results[1:]:
        assert not differences(state, first_state)
        for a, b in zip(outs, first_outs, strict=True):
            assert (a is None and b is None) or same_output(a, b)
    for k, v in shared.items():
        assert torch.equal(v, before[k]), f"a thread wrote into the shared {k}"
    assert any(o is not None for o in first_outs)
    for out, inp in zip(first_outs, inputs, strict=True):
        if out is not None:
            assert oracle.judge(out, case.format, shared, inp) is None


def test_bind_under_16_threads_with_a_kernel_failing_at_call(registry: Registry) -> None:
    """A kernel that fails in its call, hit by 16 threads at once: one prepare of it,
    one failure recorded, one fallback prepare, and every thread gets the right answer."""
    prepares, lock = Counter[str](), threading.Lock()
    broken = dense_kernel("broken_call", priority=1000)
    inner = broken.prepare

    def prepare(self: Any, tensors: Any, *, dtype: Any = None) -> Any:
        with lock:
            prepares["broken_call"] += 1
        return inner(self, tensors, dtype=dtype)

    def call(self: Any, x: torch.Tensor, prepared: Any) -> torch.Tensor:
        time.sleep(0.005)
        raise RuntimeError("vendor kernel crashed")

    broken.prepare, broken.__call__ = prepare, call
    registry.register(Plugin(broken), name="broken_call")
    gen = torch.Generator().manual_seed(4)
    w = FMT.quantize(torch.randn(64, 256, generator=gen), generator=gen)
    x = torch.randn(3, 256, generator=gen)
    barrier = threading.Barrier(THREADS)

    def work(_: int) -> tuple[torch.Tensor, str, Any]:
        barrier.wait()
        bound = bind(FMT, "cpu", w, problem=P, registry=registry)
        return bound(x), bound.kernel.name, bound  # held until every thread is done

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(work, range(THREADS)))
    assert prepares["broken_call"] == 1
    assert len({id(b) for _, _, b in results}) == 1
    assert list(selection_state(registry).failures.values()) == ["call raised RuntimeError: vendor kernel crashed"]
    assert {name for _, name, _ in results} == {"aten_cpu"}
    ref = x.double() @ FMT.dequantize(w).T
    for y, _, _ in results:
        assert torch.equal(y, results[0][0])
        assert (y.double() - ref).norm() / ref.norm() < 1e-5


def test_selection_while_plugins_come_and_go(registry: Registry) -> None:
    """15 threads select and read the registry while one registers and unregisters
    plugins: no error (a reader iterating a dict a writer grows would raise), and every
    answer is a kernel that was registered at the time."""
    import sys

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for i in range(60):
                extra = [dense_kernel(f"filler{i}_{j}", priority=1) for j in range(10)]
                registry.register(Plugin(dense_kernel("comes_and_goes", priority=400), *extra), name=f"churn{i}")
                selection_state(registry).record_failure("gptq", "linear", "nobody", "cpu", "x")
                registry.unregister(f"churn{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            stop.set()

    def select(_: int) -> set[str]:
        seen = set()
        while not stop.is_set():
            try:
                seen.add(get_kernel(FMT, "cpu", problem=P, registry=registry).name)
                explain(FMT, "cpu", problem=P, registry=registry).table()
                registry.kernels("gptq")
                registry.formats()
                registry.plugins()
                registry.broken()
            except BaseException as exc:
                errors.append(exc)
                break
        return seen

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            futures = [pool.submit(select, i) for i in range(THREADS - 1)]
            churn()
            seen = set().union(*(f.result() for f in futures))
    finally:
        sys.setswitchinterval(old_interval)
    assert not errors, errors[:3]
    assert seen <= {"aten_cpu", "comes_and_goes"} and "aten_cpu" in seen
