"""What one call costs the host: the timer and the things the ``overhead`` suite times.

:func:`host_times` issues a queue of calls and synchronises once: the host's time per call
is the time to issue them (it returns before the device has finished; a queue of 64 calls
stays far below the launch queue's depth), and the wall time per call includes draining
the queue. Where the device is faster than the host — decode — the two agree. On CUDA each
round also issues the queue again while a spin kernel holds the device (``held``): a queue
issued to a running device can still meet it — a launch whose driver resources are in use,
an allocation that waits — so the held time is the host's alone, and it is what
:meth:`HostSamples.timing` reports. On a CPU the call computes, and every time is its time.

:func:`subjects` builds, for one activation dtype and M, every quantcore kernel that runs
here (called directly, as an engine holding the prepared state calls it) and every module
(called as a model calls it) of four op families — a GPTQ-4 linear, a TurboQuant-4 linear,
the trtllm_moe routed GEMM, the SVDQuant pre-GEMM — beside ``nn.Linear`` and ``F.linear``
on the same M, K, N. A family that cannot be built here is skipped with the reason. A
kernel whose bound launch encodes its weight's TMA descriptors once is also timed with them
encoded per call, its output compared bit for bit (:mod:`._descriptors`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quantcore.formats.gptq import GPTQ
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.act_quant_lora import act_quant_lora_problem
from quantcore.ops.moe import moe_problem
from quantcore.problem import Problem
from quantcore.registry import default_registry
from quantcore.selection import explain
from quantcore.timing import Timing

from ._descriptors import ENCODED_ONCE, per_call_twin

__all__ = ["QUEUE", "HostSamples", "Subject", "host_samples", "host_times", "subjects"]

#: Calls issued per sample before the one synchronisation.
QUEUE = 64
GPTQ_FMT = GPTQ(bits=4, group_size=128, sym=True)
TURBO_FMT = TurboQuant(bits=4, group_size=128)
MOE_FMT = TRTLLMMoE(group_size=128, sym=True, scale_dtype=torch.bfloat16)
SVD_FMT = SVDQuantAct(fp4=True)
#: The routed GEMM's experts and routes per token, and the SVDQuant LoRA rank.
MOE_E, MOE_TOPK, SVD_R = 8, 2, 32


#: Why a call that reads device values on the host is not captured.
SYNCS = "reads the expert ids on the host (a synchronisation): not capturable"


@dataclass
class Subject:
    """One thing timed: ``kind`` is ``kernel`` (a direct call), ``module`` or ``dense``
    (the peers nn.Linear and F.linear). ``graph`` is what a CUDA graph captures in its
    place (the same call unless given); ``no_graph`` says why nothing is."""

    name: str
    kind: str
    fn: Callable[[int], object]
    note: str = ""
    graph: Callable[[int], object] | None = None
    no_graph: str = ""

    @property
    def captured(self) -> Callable[[int], object]:
        return self.graph or self.fn


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class HostSamples:
    """One callable's samples, one per round: seconds per call to issue the queue
    (``host``), per call with the queue drained (``wall``), and (CUDA) to issue it while
    a spin kernel holds the device (``held``; empty elsewhere)."""

    host: tuple[float, ...]
    wall: tuple[float, ...]
    held: tuple[float, ...] = ()

    @property
    def issue(self) -> tuple[float, ...]:
        """The host's own time per call: ``held`` where measured, else ``host``."""
        return self.held or self.host

    def timing(self) -> Timing:
        med = statistics.median(self.issue)
        spread = (max(self.issue) - min(self.issue)) / med if med > 0 else 0.0
        return Timing(med, spread, len(self.issue), "host-held" if self.held else "host-queue")

    def paired_ratio(self, base: HostSamples) -> float:
        """The median over rounds of this callable's host time (:attr:`issue`) over
        ``base``'s in the same round. The rounds interleave the callables, so a slow spell
        of the machine (another tenant, a frequency change) that lasts a round scales both
        sides of a ratio alike, where a ratio of medians over rounds takes it at full weight."""
        return statistics.median(t / b for t, b in zip(self.issue, base.issue, strict=True))


#: GPU clock cycles a second that a hold's spin is sized by (a little above an H100's or
#: H200's boost clock, so the spin lasts at least as long as asked).
HOLD_HZ = 2.0e9


def _held_queue(fn: Callable[[int], object], device: torch.device, calls: int, free_s: float) -> float:
    """Seconds per call to issue ``calls`` calls while a spin kernel holds ``device`` for
    three times (at least 2 ms) what the free-running queue took to issue."""
    torch.cuda._sleep(int(max(2e-3, 3 * free_s) * HOLD_HZ))
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    t1 = time.perf_counter()
    _sync(device)
    return (t1 - t0) / calls


def host_samples(fns: Sequence[Callable[[int], object]], device: torch.device, *, rounds: int = 5,
                 calls: int = QUEUE) -> list[HostSamples]:
    """Per callable, interleaved over ``rounds``: the host time per call issuing a queue of
    ``calls``, the wall time per call with the queue drained and (CUDA) the host time per
    call with the device held, one sample a round."""
    host: list[list[float]] = [[] for _ in fns]
    wall: list[list[float]] = [[] for _ in fns]
    held: list[list[float]] = [[] for _ in fns]
    for fn in fns:  # warm: compile, bind, allocate
        for i in range(3):
            fn(i)
    _sync(device)
    for _ in range(rounds):
        for j, fn in enumerate(fns):
            _sync(device)
            t0 = time.perf_counter()
            for i in range(calls):
                fn(i)
            t1 = time.perf_counter()
            _sync(device)
            t2 = time.perf_counter()
            host[j].append((t1 - t0) / calls)
            wall[j].append((t2 - t0) / calls)
            if device.type == "cuda":
                held[j].append(_held_queue(fn, device, calls, t1 - t0))
    return [HostSamples(tuple(h), tuple(w), tuple(d)) for h, w, d in zip(host, wall, held, strict=True)]


def host_times(fns: Sequence[Callable[[int], object]], device: torch.device, *, rounds: int = 5,
               calls: int = QUEUE) -> list[tuple[Timing, float]]:
    """Per callable, interleaved over ``rounds``: (the median host time per call issuing a
    queue of ``calls``, the median wall time per call with the queue drained)."""
    return [(s.timing(), statistics.median(s.wall))
            for s in host_samples(fns, device, rounds=rounds, calls=calls)]


def _kernels(fmt: Any, op: str, problem: Problem, device: torch.device, skipped: dict[str, str]) -> list[Any]:
    """Every registered kernel that runs ``problem`` here; a CPU leaves out Triton's (its
    interpreter runs them: a correctness tool, not a launch)."""
    out = []
    for cand in explain(fmt, str(device), problem=problem).candidates:
        if cand.status not in ("selected", "usable"):
            if cand.status != "broken":
                skipped[f"{cand.kernel}"] = f"{cand.status}: {cand.reason}"
            continue
        cls = default_registry().kernel(fmt.name, op, cand.kernel).cls
        if device.type == "cpu" and "triton" in cls.requires.packages:
            skipped[cand.kernel] = "on a CPU Triton's interpreter runs it: its host time is not a launch's"
            continue
        out.append(cls(fmt, device))
    return out


def _kernel_subjects(family: str, fmt: Any, op: str, problem: Problem, device: torch.device,
                     tensors: dict[str, torch.Tensor], x: torch.Tensor, skipped: dict[str, str],
                     note: str = "") -> list[Subject]:
    """Every kernel of :func:`_kernels`, prepared once for ``tensors`` and called directly
    on ``x``, as an engine holding the prepared state calls it; after one of
    :data:`ENCODED_ONCE`, its twin with the descriptors encoded per call."""
    out = []
    for kernel in _kernels(fmt, op, problem, device, skipped):
        prepared = kernel.prepare(tensors, dtype=x.dtype)
        name = f"{family}:{kernel.name}"
        if kernel.name not in ENCODED_ONCE or device.type != "cuda":
            out.append(Subject(name, "kernel", lambda i, k=kernel, p=prepared: k(x, p), note))
            continue
        twin, twin_note, own_note = per_call_twin(kernel, tensors, x, prepared)
        out.append(Subject(name, "kernel", lambda i, k=kernel, p=prepared: k(x, p), "; ".join(filter(None, (note, own_note)))))
        out.append(Subject(f"{name}[descriptors per call]", "kernel", twin, "; ".join(filter(None, (note, twin_note)))))
    return out


def _linear_family(family: str, fmt: Any, module_name: str,
                   module_of: Callable[[dict[str, torch.Tensor]], torch.nn.Module], device: torch.device,
                   dtype: torch.dtype, m: int, k: int, n: int, gen: torch.Generator,
                   skipped: dict[str, str]) -> list[Subject]:
    """A quantized linear family: its kernels, then its module (``module_of`` the weight's
    tensors), on one random weight and activation."""
    tensors = fmt.quantize(torch.randn(n, k, generator=gen, device=gen.device).to(device) * 0.02)
    x = torch.randn(m, k, device=device).to(dtype)
    problem = Problem.linear(fmt, M=m, K=k, N=n, dtype=dtype)
    out = _kernel_subjects(family, fmt, "linear", problem, device, tensors, x, skipped)
    module = module_of(tensors)
    out.append(Subject(module_name, "module", lambda i: module(x), f"kernel {module.kernel.name}"))
    return out


def _gptq(device: torch.device, dtype: torch.dtype, m: int, k: int, n: int, gen: torch.Generator,
          skipped: dict[str, str]) -> list[Subject]:
    """The family, then its module read as a fused gate/up layer (N = 2·I): the layer's call
    and the activation's, and ``QuantLinear.gated`` (one launch where its kernel ends gated;
    a capture takes the two)."""
    from quantcore.kernels.gated_activation import gated_activation
    from quantcore.nn.linear import QuantLinear

    modules: list[QuantLinear] = []

    def module_of(tensors: dict[str, torch.Tensor]) -> QuantLinear:
        modules.append(QuantLinear(GPTQ_FMT, tensors, device=device, dtype=dtype))
        return modules[-1]

    out = _linear_family("gptq4", GPTQ_FMT, "QuantLinear(gptq4)", module_of, device, dtype, m, k, n, gen, skipped)
    layer, x = modules[-1], torch.randn(m, k, device=device).to(dtype)
    gate_up = f"[{n}, {k}] as gate/up, I = {n // 2}"
    out.append(Subject("QuantLinear(gptq4) + gated_activation", "module",
                       lambda i: gated_activation(layer(x), "silu"), f"{gate_up}: the layer's call, then the activation's"))
    out.append(Subject("QuantLinear(gptq4).gated", "module", lambda i: layer.gated(x),
                       f"{gate_up}: one call (kernel {layer.kernel.name}; one launch where it ends gated)"))
    return out


def _turbo(device: torch.device, dtype: torch.dtype, m: int, k: int, n: int, gen: torch.Generator,
           skipped: dict[str, str]) -> list[Subject]:
    from quantcore.nn.turboquant import TurboQuantLinear

    def module_of(tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
        module = TurboQuantLinear(k, n, TURBO_FMT, bias=False, device=device, dtype=dtype)
        module.load_tensors(tensors)
        return module

    return _linear_family("turboquant4", TURBO_FMT, "TurboQuantLinear(tq4)", module_of,
                          device, dtype, m, k, n, gen, skipped)


def _moe(device: torch.device, dtype: torch.dtype, m: int, k: int, n: int, gen: torch.Generator,
         skipped: dict[str, str]) -> list[Subject]:
    from quantcore.nn.moe import QuantExperts

    on = {"generator": gen, "device": gen.device}
    tensors = {"qweight": torch.randint(-128, 128, (MOE_E, k, n), dtype=torch.int8, **on).to(device),
               "scales": (torch.rand(MOE_E, k // MOE_FMT.group_size, n, **on) * 2e-4 + 1e-4).to(device, torch.bfloat16)}
    x = torch.randn(m, k, device=device).to(dtype)
    ids = torch.rand(m, MOE_E, **on).argsort(dim=1)[:, :MOE_TOPK].to(device, torch.int32)
    problem = moe_problem(MOE_FMT, T=m, E=MOE_E, topk=MOE_TOPK, K=k, N=n, dtype=dtype)
    out = []
    for kernel in _kernels(MOE_FMT, "moe", problem, device, skipped):
        prepared = kernel.prepare(tensors, dtype=dtype)
        forward = getattr(kernel, "forward", None)  # the call without the ids check, where there is one
        out.append(Subject(
            f"trtllm_moe:{kernel.name}", "kernel", lambda i, k=kernel, p=prepared: k(x, ids, p),
            f"E={MOE_E}, top-{MOE_TOPK}; graph: forward (the call without its checks)",
            graph=(lambda i, f=forward, p=prepared: f(x, ids, p)) if forward is not None else None,
            no_graph="" if forward is not None else SYNCS))
    module = QuantExperts(MOE_FMT, tensors, device=device, dtype=dtype)
    # trtllm_moe_triton does not read the ids on CUDA (backends/trtllm_moe/README.md); the others do.
    reads_ids = module.kernel.name != "trtllm_moe_triton" or device.type != "cuda"
    out.append(Subject("QuantExperts(trtllm_moe)", "module", lambda i: module(x, ids), f"kernel {module.kernel.name}",
                       no_graph=SYNCS if reads_ids else ""))
    return out


def _svdquant(device: torch.device, dtype: torch.dtype, m: int, k: int, n: int, gen: torch.Generator,
              skipped: dict[str, str]) -> list[Subject]:
    from quantcore.nn.svdquant import SVDQuantActQuant

    on = {"generator": gen, "device": gen.device}
    tensors = {"lora_down": (torch.randn(k, SVD_R, **on) * 0.05).to(device, dtype),
               "smooth": torch.exp(torch.randn(k, **on) * 0.5).to(device, dtype)}
    x = torch.randn(m, k, device=device).to(dtype)
    problem = act_quant_lora_problem(SVD_FMT, M=m, N=k, R=SVD_R, dtype=dtype)
    out = _kernel_subjects("svdquant_nvfp4", SVD_FMT, "act_quant_lora", problem, device, tensors, x, skipped,
                           f"N={k}, R={SVD_R}")
    module = SVDQuantActQuant(SVD_FMT, tensors, device=device, dtype=dtype)
    out.append(Subject("SVDQuantActQuant(nvfp4)", "module", lambda i: module(x), f"kernel {module.kernel.name}"))
    return out


FAMILIES = {"gptq4": _gptq, "turboquant4": _turbo, "trtllm_moe": _moe, "svdquant_nvfp4": _svdquant}


def subjects(device: torch.device, dtype: torch.dtype, m: int, k: int, n: int) -> tuple[list[Subject], dict[str, str]]:
    """The peers, then every family's kernels and modules; ``skipped`` says what could not
    be built here and why."""
    gen = torch.Generator(device=device).manual_seed(m)
    linear = torch.nn.Linear(k, n, bias=False, device=device, dtype=dtype)
    x = torch.randn(m, k, device=device).to(dtype)
    w = linear.weight.detach()
    out = [Subject("nn.Linear", "dense", lambda i: linear(x)),
           Subject("F.linear", "dense", lambda i: torch.nn.functional.linear(x, w))]
    skipped: dict[str, str] = {}
    with torch.no_grad():
        for name, build in FAMILIES.items():
            try:
                out += build(device, dtype, m, k, n, gen, skipped)
            except Exception as exc:  # one family that cannot be built here does not stop the rest
                skipped[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return out, skipped
