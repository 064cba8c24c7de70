"""How much Python work does a call of each Triton backend do, with no GPU: every call path
run on a CPU with the compiled kernel's launcher stubbed (a no-op where the C launcher
would call ``cuLaunchKernelEx``), bound (``quantcore.triton.launch.Launch``) against
Triton's own ``kernel[grid](...)`` path with a warm cache; and what a module and the
custom op add over a kernel's direct call, measured on the torch kernels of each family.

What the stub replaces: the compiler (one fake binary per specialisation, as Triton keys
them), the CUDA runtime queries (device, stream, target: an H100) and the C launcher; everything else —
the checks, the buckets, the allocations on the CPU, Triton's binder and cache lookup on
the plain path — runs as on a GPU. So the numbers are the host's Python work on this CPU,
not a GPU machine's host µs (``quantcore bench overhead`` on the GPU gives those).

    python -m tools.probes.launch_host_cost [--calls 2000] [--json PATH]

Run with ``TRITON_INTERPRET`` unset (the kernels must be compiled ``JITFunction`` objects).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

H100 = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", multi_processor_count=132)
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
             (launch._Cuda, "device", launch._Cuda.device), (launch._Cuda, "stream", launch._Cuda.stream)]
    saved += [(m, "Launch", m.Launch) for m in (int4_launch, fused, moe_launch, svd_launch)]
    jit.driver = Driver
    jit.JITFunction._do_compile = compile_
    torch.cuda.get_device_properties = lambda device=None: H100
    launch._Cuda.device = staticmethod(lambda: 0)  # type: ignore[assignment]
    launch._Cuda.stream = staticmethod(lambda index: 0)  # type: ignore[assignment]
    for m in (int4_launch, fused, moe_launch, svd_launch):
        m.Launch = ProbeLaunch
    launch._states.clear()  # no bucket of the other mode survives
    try:
        yield
    finally:
        launch._states.clear()
        for owner, name, value in saved:
            setattr(owner, name, value)


def per_call(fn: Callable[[], object], calls: int, repeats: int = 5) -> float:
    """The best of ``repeats`` runs of ``calls`` calls: seconds per call."""
    for _ in range(min(calls, 50)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def triton_paths(m: int) -> dict[str, Callable[[], object]]:
    """The direct call of each Triton kernel at M (K = N = 4096; the MoE: E = 8, top-2)."""
    from quantcore.backends.triton_int4.kernel import TritonInt4GPTQ
    from quantcore.backends.triton_nvfp4 import TritonNVFP4
    from quantcore.backends.trtllm_moe.triton_kernel import TritonMoE
    from quantcore.backends.turboquant_triton import TurboQuantTriton
    from quantcore.formats.gptq import GPTQ
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.formats.trtllm_moe import TRTLLMMoE
    from quantcore.formats.turboquant import TurboQuant

    gen = torch.Generator().manual_seed(0)
    k = n = 4096
    x = torch.randn(m, k, generator=gen).bfloat16()
    gptq = GPTQ(bits=4, group_size=128, sym=True)
    int4 = TritonInt4GPTQ(gptq, "cpu")
    w_int4 = int4.prepare(gptq.quantize(torch.randn(n, k, generator=gen) * 0.02))
    tq = TurboQuant(bits=4, group_size=128)
    turbo = TurboQuantTriton(tq, "cpu")
    w_tq = turbo.prepare(tq.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen), dtype=torch.bfloat16)
    moe_fmt = TRTLLMMoE(group_size=128, sym=True, scale_dtype=torch.bfloat16)
    moe = TritonMoE(moe_fmt, "cpu")
    w_moe = moe.prepare({"qweight": torch.randint(-128, 128, (8, k, 1024), dtype=torch.int8, generator=gen),
                         "scales": (torch.rand(8, k // 128, 1024, generator=gen) * 1e-3).bfloat16()},
                        dtype=torch.bfloat16)
    ids = torch.randint(0, 8, (m, 2), generator=gen, dtype=torch.int32)
    svd_fmt = SVDQuantAct(fp4=True)
    svd = TritonNVFP4(svd_fmt, "cpu")
    w_svd = svd.prepare({"lora_down": torch.randn(k, 32, generator=gen).bfloat16(),
                         "smooth": (torch.rand(k, generator=gen) + 0.5).bfloat16()}, dtype=torch.bfloat16)
    return {
        "triton_int4": lambda: int4(x, w_int4),
        "turboquant_triton": lambda: turbo(x, w_tq),
        "trtllm_moe_triton": lambda: moe(x, ids, w_moe),
        "trtllm_moe_triton.forward": lambda: moe.forward(x, ids, w_moe),
        "triton_nvfp4": lambda: svd(x, w_svd),
    }


def module_paths() -> dict[str, tuple[Callable[[], object], Callable[[], object], Callable[[], object]]]:
    """Per family at a tiny shape: (the kernel's direct call, the module's call, the custom
    op's eager call), all on the same torch kernel and prepared state."""
    from quantcore.custom_ops import call_op
    from quantcore.formats.gptq import GPTQ
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.formats.trtllm_moe import TRTLLMMoE
    from quantcore.formats.turboquant import TurboQuant
    from quantcore.nn.linear import QuantLinear
    from quantcore.nn.moe import QuantExperts
    from quantcore.nn.svdquant import SVDQuantActQuant
    from quantcore.nn.turboquant import TurboQuantLinear

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 128, generator=gen).bfloat16()
    gptq = GPTQ(bits=4, group_size=128, sym=True)
    linear = QuantLinear(gptq, gptq.quantize(torch.randn(256, 128, generator=gen) * 0.02), device="cpu")
    tq = TurboQuant(bits=4, group_size=128)
    turbo = TurboQuantLinear(128, 256, tq, bias=False, device="cpu", dtype=torch.bfloat16)
    turbo.load_tensors(tq.quantize(torch.randn(256, 128, generator=gen) * 0.02, generator=gen))
    moe_fmt = TRTLLMMoE(group_size=64, sym=True, scale_dtype=torch.bfloat16)
    experts = QuantExperts(moe_fmt, {"qweight": torch.randint(-128, 128, (4, 128, 64), dtype=torch.int8, generator=gen),
                                     "scales": (torch.rand(4, 2, 64, generator=gen) * 1e-3).bfloat16()}, device="cpu")
    ids = torch.randint(0, 4, (1, 2), generator=gen, dtype=torch.int32)
    svd = SVDQuantActQuant(SVDQuantAct(fp4=True), {"lora_down": torch.randn(128, 16, generator=gen).bfloat16()},
                           device="cpu")
    out = {}
    for name, module, args in (("QuantLinear", linear, (x,)), ("TurboQuantLinear", turbo, (x,)),
                               ("QuantExperts", experts, (x, ids)), ("SVDQuantActQuant", svd, (x,))):
        kernel, prepared, state = module.kernel, module.prepared, module.state_tensors()
        out[f"{name} ({kernel.name})"] = (
            lambda k=kernel, p=prepared, a=args: k(*a, p),
            lambda m=module, a=args: m(*a),
            lambda m=module, s=state, a=args: call_op(m.op_kind, m._spec, s, *a),
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.probes.launch_host_cost")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--json", help="also write the numbers here")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the probe stubs compiled kernels, not the interpreter", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    results: dict[str, Any] = {"triton": {}, "modules": {}}
    print(f"{'Triton call path (K = N = 4096)':34s} {'M':>5s} {'bound µs':>9s} {'plain µs':>9s}")
    with torch.inference_mode():
        for m in (1, 16):
            paths = triton_paths(m)
            for name, fn in paths.items():
                times = {}
                for mode in ("bound", "plain"):
                    with stubbed(plain=mode == "plain"):
                        times[mode] = per_call(fn, args.calls)
                results["triton"][f"{name}/M{m}"] = times
                print(f"{name:34s} {m:5d} {times['bound'] * 1e6:9.2f} {times['plain'] * 1e6:9.2f}")
        unbound = {f"{made._fn.__name__}: {made.fallback}" for made in MADE
                   if made.fallback and not made.fallback.startswith("probe")}
        if unbound:
            print("launches that did not bind:", *sorted(unbound), sep="\n  ")
        print(f"\n{'module (kernel), tiny shape':34s} {'kernel µs':>9s} {'module µs':>9s} {'op µs':>9s}")
        for name, (kernel, module, op) in module_paths().items():
            times = {"kernel": per_call(kernel, args.calls), "module": per_call(module, args.calls),
                     "custom_op": per_call(op, args.calls)}
            results["modules"][name] = times
            print(f"{name:34s} {times['kernel'] * 1e6:9.2f} {times['module'] * 1e6:9.2f} {times['custom_op'] * 1e6:9.2f}")
        dense = torch.nn.Linear(128, 256, bias=False, dtype=torch.bfloat16)
        x = torch.randn(1, 128).bfloat16()
        results["nn.Linear"] = per_call(lambda: dense(x), args.calls)
        print(f"\nnn.Linear (128 → 256, this CPU, computing): {results['nn.Linear'] * 1e6:.2f} µs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
