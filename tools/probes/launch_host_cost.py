"""How much Python work does a call of each Triton backend do, with no GPU: every call path
run on a CPU with the compiled kernel's launcher stubbed (a no-op where the C launcher
would call ``cuLaunchKernelEx``), bound (``quantcore.triton.launch.Launch``) against
Triton's own ``kernel[grid](...)`` path with a warm cache; and what each module's eager
call and the custom op's eager call add over the direct call of the same kernel on the
same prepared state (bound launches, kernel, module and op taking turns).

What the stub replaces: the compiler (one fake binary per specialisation, as Triton keys
them), the CUDA runtime queries (current device, stream, target, device properties: an
H100, so the launchers' card keys find the H100's tuned tables) and the C launcher;
everything else — the checks, the buckets, the allocations on the CPU, Triton's binder
and cache lookup on the plain path, the modules — runs as on a GPU. So the numbers are the
host's Python work on this CPU, not a GPU machine's host µs (``quantcore bench overhead``
on the GPU gives those). TurboQuant at M = 16 rotates its input by a GEMM before the
kernel: that GEMM computes here, so its row is mostly compute.

    python -m tools.probes.launch_host_cost [--calls 2000] [--repeats 5] [--ms 1,16] [--label NAME] [--json PATH]

``--json`` appends the run, labelled, to a JSON list (run once per tree to compare two).
Run with ``TRITON_INTERPRET`` unset (the kernels must be compiled ``JITFunction`` objects).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import sys
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: The device properties the stubbed runtime reports: an H100 SXM, every field a launcher
#: reads (its name and SM count, and the fields of its card key, ``quantcore.probe.card``).
H100 = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
                             shared_memory_per_block_optin=227 * 1024, memory_clock_rate=2_619_000,
                             memory_bus_width=5120)
#: Every launch the stubbed backends made (to report any that did not bind).
MADE: list[Any] = []


class _FakeCompiled:
    """A compiled kernel whose launcher does nothing."""

    function = 0
    packed_metadata = (4, 1, 0)

    @staticmethod
    def run(*args: Any) -> None:
        return None

    @staticmethod
    def launch_metadata(*args: Any) -> None:
        return None


@contextlib.contextmanager
def stubbed(plain: bool) -> Iterator[None]:
    """Triton and the CUDA runtime stubbed as the module docstring says; ``plain``: every
    launch through ``kernel[grid]`` (Triton's per-call path), else bound."""
    import triton.runtime.jit as jit
    from triton.backends.compiler import GPUTarget

    from quantcore.backends.triton_int4 import launch as int4_launch
    from quantcore.backends.trtllm_moe import triton_launch as moe_launch
    from quantcore.backends.turboquant_triton import fused
    from quantcore.kernels.svdquant import triton_launch as svd_launch
    from quantcore.probe import card_tables
    from quantcore.triton import launch

    class Driver:
        class active:  # the attribute Triton reads
            get_current_device = staticmethod(lambda: 0)
            get_current_stream = staticmethod(lambda device: 0)
            get_current_target = staticmethod(lambda: GPUTarget("cuda", 90, 32))

    class ProbeLaunch(launch.Launch):
        def __init__(self, fn: Any, *, device: torch.device, **kw: Any) -> None:
            super().__init__(fn, device=torch.device("cuda", 0), **kw)
            if plain:
                self.fallback = "probe: Triton's own path"
            MADE.append(self)

    def compile_(self: Any, key: Any, *args: Any, **kwargs: Any) -> _FakeCompiled:
        self.device_caches[0][0][key] = kernel = _FakeCompiled()
        return kernel

    saved = [(jit, "driver", jit.driver), (jit.JITFunction, "_do_compile", jit.JITFunction._do_compile),
             (torch.cuda, "get_device_properties", torch.cuda.get_device_properties),
             (torch.cuda, "current_device", torch.cuda.current_device),
             (launch._Cuda, "device", launch._Cuda.device), (launch._Cuda, "stream", launch._Cuda.stream)]
    saved += [(m, "Launch", m.Launch) for m in (int4_launch, fused, moe_launch, svd_launch)]
    jit.driver = Driver
    jit.JITFunction._do_compile = compile_
    torch.cuda.get_device_properties = lambda device=None: H100
    torch.cuda.current_device = lambda: 0
    launch._Cuda.device = staticmethod(lambda: 0)  # type: ignore[assignment]
    launch._Cuda.stream = staticmethod(lambda index: 0)  # type: ignore[assignment]
    for m in (int4_launch, fused, moe_launch, svd_launch):
        m.Launch = ProbeLaunch
    launch._states.clear()  # no bucket of the other mode survives
    card_tables._cuda_card.cache_clear()  # no card read before (or after) the stub is kept
    try:
        yield
    finally:
        launch._states.clear()
        card_tables._cuda_card.cache_clear()
        for owner, name, value in saved:
            setattr(owner, name, value)


def per_call(fn: Callable[[], object], calls: int, repeats: int = 5) -> float:
    """The best of ``repeats`` runs of ``calls`` calls: seconds per call."""
    return interleaved({"fn": fn}, calls, repeats)["fn"]


def functions_per_call(fn: Callable[[], object], calls: int = 20) -> float:
    """How many Python and built-in functions one call runs (``cProfile``'s count, after a
    warm call): unlike a time, it does not move with the machine's load."""
    fn()
    profile = cProfile.Profile()
    profile.runcall(lambda: [fn() for _ in range(calls)])
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return (sum(v[1] for v in stats.values()) - 2) / calls  # less the lambda and its list comprehension


def interleaved(fns: dict[str, Callable[[], object]], calls: int, repeats: int = 5) -> dict[str, float]:
    """Per callable, the best of ``repeats`` runs of ``calls`` calls (seconds per call),
    the callables taking turns in every repeat so that a slower spell of a shared machine
    reaches them all alike."""
    for fn in fns.values():
        for _ in range(min(calls, 50)):
            fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls)
    return best


@dataclass
class Family:
    """One Triton backend at one M: its kernel, a prepared weight, the call's inputs, and
    the module holding that kernel and prepared state."""

    kernel: Any
    prepared: Any
    inputs: tuple[torch.Tensor, ...]
    module: Any

    def direct(self) -> object:
        return self.kernel(*self.inputs, self.prepared)


def families(m: int) -> dict[str, Family]:
    """Each Triton backend at M (K = N = 4096; the MoE: E = 8, top-2, N = 1024), keyed by
    its module's name. The module is a skeleton of the weight's dims given the kernel's
    prepared state as binding gives it (a CPU's ranking refuses Triton without its
    interpreter, so ``prefer=`` cannot choose it here)."""
    from quantcore.backends.triton_int4.kernel import TritonInt4GPTQ
    from quantcore.backends.triton_nvfp4 import TritonNVFP4
    from quantcore.backends.trtllm_moe.triton_kernel import TritonMoE
    from quantcore.backends.turboquant_triton import TurboQuantTriton
    from quantcore.formats.gptq import GPTQ
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.formats.trtllm_moe import TRTLLMMoE
    from quantcore.formats.turboquant import TurboQuant
    from quantcore.nn.linear import QuantLinear
    from quantcore.nn.moe import QuantExperts
    from quantcore.nn.svdquant import SVDQuantActQuant
    from quantcore.nn.turboquant import TurboQuantLinear

    gen = torch.Generator().manual_seed(0)
    k = n = 4096
    e, n_moe, rank = 8, 1024, 32
    x = torch.randn(m, k, generator=gen).bfloat16()
    gptq = GPTQ(bits=4, group_size=128, sym=True)
    tq = TurboQuant(bits=4, group_size=128)
    moe_fmt = TRTLLMMoE(group_size=128, sym=True, scale_dtype=torch.bfloat16)
    svd_fmt = SVDQuantAct(fp4=True)
    ids = torch.randint(0, e, (m, 2), generator=gen, dtype=torch.int32)
    built = {
        "QuantLinear": (TritonInt4GPTQ(gptq, "cpu"), gptq.quantize(torch.randn(n, k, generator=gen) * 0.02), (x,),
                        QuantLinear(gptq, in_features=k, out_features=n, device="cpu")),
        "TurboQuantLinear": (TurboQuantTriton(tq, "cpu"),
                             tq.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen), (x,),
                             TurboQuantLinear(k, n, tq, bias=False, device="cpu", dtype=torch.bfloat16)),
        "QuantExperts": (TritonMoE(moe_fmt, "cpu"),
                         {"qweight": torch.randint(-128, 128, (e, k, n_moe), dtype=torch.int8, generator=gen),
                          "scales": (torch.rand(e, k // 128, n_moe, generator=gen) * 1e-3).bfloat16()}, (x, ids),
                         QuantExperts(moe_fmt, num_experts=e, in_features=k, out_features=n_moe, device="cpu")),
        "SVDQuantActQuant": (TritonNVFP4(svd_fmt, "cpu"),
                             {"lora_down": torch.randn(k, rank, generator=gen).bfloat16(),
                              "smooth": (torch.rand(k, generator=gen) + 0.5).bfloat16()}, (x,),
                             SVDQuantActQuant(svd_fmt, in_features=k, rank=rank, device="cpu")),
    }
    out = {}
    for name, (kernel, tensors, inputs, module) in built.items():
        prepared = kernel.prepare(tensors, dtype=torch.bfloat16)
        module._adopt(kernel, prepared)
        out[name] = Family(kernel, prepared, inputs, module)
    return out


def triton_paths(found: dict[str, Family]) -> dict[str, Callable[[], object]]:
    """The direct call of each Triton kernel (and the MoE's call without its checks)."""
    moe = found["QuantExperts"]
    out = {f.kernel.name: f.direct for f in found.values()}
    out["trtllm_moe_triton.forward"] = lambda: moe.kernel.forward(*moe.inputs, moe.prepared)
    return out


def module_paths(found: dict[str, Family]) -> dict[str, dict[str, Callable[[], object]]]:
    """Per module: the kernel's direct call, the module's call and the custom op's eager
    call, all on the same kernel and prepared state."""
    from quantcore.custom_ops import call_op

    out = {}
    for name, f in found.items():
        state, op, spec = f.module.state_tensors(), f.module.op_kind, f.module._spec
        out[f"{name} ({f.kernel.name})"] = {
            "kernel": f.direct,
            "module": lambda f=f: f.module(*f.inputs),
            "custom_op": lambda f=f, s=state, o=op, sp=spec: call_op(o, sp, s, *f.inputs),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.probes.launch_host_cost")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--label", default="this tree")
    p.add_argument("--ms", default="1,16", help="the batch rows M, comma-separated (1,16,128,1024: across the buckets)")
    p.add_argument("--json", type=Path, help="append the numbers to this JSON list")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the probe stubs compiled kernels, not the interpreter", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    results: dict[str, Any] = {"label": args.label, "torch": torch.__version__, "calls": args.calls,
                               "repeats": args.repeats, "triton": {}, "modules": {}}
    rows = []
    print(f"{'Triton call path (K = N = 4096)':38s} {'M':>5s} {'bound µs':>9s} {'plain µs':>9s}")
    with torch.inference_mode():
        for m in (int(v) for v in args.ms.split(",")):
            found = families(m)
            for name, fn in triton_paths(found).items():
                times = {}
                for mode in ("bound", "plain"):
                    with stubbed(plain=mode == "plain"):
                        times[mode] = per_call(fn, args.calls, args.repeats)
                results["triton"][f"{name}/M{m}"] = times
                print(f"{name:38s} {m:5d} {times['bound'] * 1e6:9.2f} {times['plain'] * 1e6:9.2f}")
            with stubbed(plain=False):
                for name, paths in module_paths(found).items():
                    times = interleaved(paths, args.calls, args.repeats)
                    times["module_over_kernel"] = times["module"] - times["kernel"]
                    times["custom_op_over_kernel"] = times["custom_op"] - times["kernel"]
                    counted = {k: functions_per_call(fn) for k, fn in paths.items()}
                    times["functions_module_over_kernel"] = counted["module"] - counted["kernel"]
                    times["functions_custom_op_over_kernel"] = counted["custom_op"] - counted["kernel"]
                    results["modules"][f"{name}/M{m}"] = times
                    rows.append((name, m, times))
        unbound = {f"{made._fn.__name__}: {made.fallback}" for made in MADE
                   if made.fallback and not made.fallback.startswith("probe")}
        if unbound:
            print("launches that did not bind:", *sorted(unbound), sep="\n  ")
        results["unbound"] = sorted(unbound)
        print(f"\n{'module (kernel), bound launches':38s} {'M':>5s} {'kernel µs':>9s} {'module µs':>9s} {'+µs':>6s} "
              f"{'+fns':>5s} {'op µs':>9s} {'+µs':>6s} {'+fns':>5s}")
        for name, m, t in rows:
            print(f"{name:38s} {m:5d} {t['kernel'] * 1e6:9.2f} {t['module'] * 1e6:9.2f} "
                  f"{t['module_over_kernel'] * 1e6:6.2f} {t['functions_module_over_kernel']:5.0f} "
                  f"{t['custom_op'] * 1e6:9.2f} {t['custom_op_over_kernel'] * 1e6:6.2f} "
                  f"{t['functions_custom_op_over_kernel']:5.0f}")
        dense = torch.nn.Linear(128, 256, bias=False, dtype=torch.bfloat16)
        x = torch.randn(1, 128).bfloat16()
        results["nn.Linear"] = per_call(lambda: dense(x), args.calls, args.repeats)
        print(f"\nnn.Linear (128 → 256, this CPU, computing): {results['nn.Linear'] * 1e6:.2f} µs")
    if args.json:
        runs = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([*runs, results], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
