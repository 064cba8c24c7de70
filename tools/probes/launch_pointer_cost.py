"""What a bound Triton launch pays per tensor argument on a GPU host.

Triton 3.6's C launcher turns each pointer argument into an address: an ``int`` is taken
as it is; anything else has its ``data_ptr()`` called and the address checked by the
driver (``cuPointerGetAttribute``, to refuse a CPU tensor). This times, per call and on
the same compiled kernel (16 pointer arguments, 4 integers; the GPU held by a sleeping
kernel so the queue never drains):

* ``tensors`` — every pointer a tensor (what :class:`quantcore.triton.launch.Launch` passes);
* ``fixed ints`` — the 14 weight-like pointers as ints, the activation and output tensors;
* ``all ints`` — every pointer an int;
* ``Launch`` — the bound launch itself, with the fixed pointers as tensors and as ints;
* ``Launch, fixed_pointers`` — a second bound launch of the same kernel told that the 14
  weight-like positions are fixed (``fixed_pointers``), called with tensors: it passes
  their addresses itself;
* ``capturing?`` — ``torch.cuda.is_current_stream_capturing()``, a call a launcher would
  make to choose a plan for graph capture;
* ``nn.Linear`` — the dense layer at M = 1, K = N = 4096, for scale.

    python -m tools.probes.launch_pointer_cost [--calls 400] [--repeats 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

from quantcore.triton.launch import Launch

POINTERS = 16


@triton.jit
def _sixteen(p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, x, out, n, k, s1, s2,
             BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask, other=0.0)
    tl.store(out + offs, v + tl.load(p0 + offs, mask=mask, other=0.0), mask=mask)


def _held(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``calls`` calls issued while a sleeping kernel holds the GPU."""
    torch.cuda._sleep(20_000_000)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = (time.perf_counter() - t0) / calls
    torch.cuda.synchronize()
    return dt


def measure(calls: int, repeats: int) -> dict[str, float]:
    dev = torch.device("cuda")
    bufs = [torch.randn(1024, device=dev) for _ in range(POINTERS)]
    ints = [b.data_ptr() for b in bufs]
    launch = Launch(_sixteen, device=dev, varying=(14, 15), constexprs=dict(BLOCK=1024), options=dict(num_warps=4))
    launch((1, 1, 1), *bufs, 1024, 4096, 1, 1)  # binds
    fixed = Launch(_sixteen, device=dev, varying=(14, 15), fixed_pointers=range(14), constexprs=dict(BLOCK=1024),
                   options=dict(num_warps=4))
    fixed((1, 1, 1), *bufs, 1024, 4096, 1, 1)  # binds
    assert all(b.fixed_addresses for b in fixed._bound.values()), "the fixed pointers were not bound"
    bound = next(iter(launch._bound.values()))
    stream = torch.cuda.current_stream().cuda_stream
    tail = (1024,)

    def run(args: list[object]) -> Callable[[], object]:
        return lambda: bound.run(1, 1, 1, stream, bound.function, bound.metadata, None, None, None, *args, 1024, 4096,
                                 1, 1, *tail)

    linear = torch.nn.Linear(4096, 4096, bias=False, device=dev, dtype=torch.bfloat16)
    xl = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    fns: dict[str, Callable[[], object]] = {
        "tensors": run(list(bufs)),
        "fixed ints": run([*ints[:14], *bufs[14:]]),
        "all ints": run(list(ints)),
        "Launch, tensors": lambda: launch((1, 1, 1), *bufs, 1024, 4096, 1, 1),
        "Launch, fixed ints": lambda: launch((1, 1, 1), *ints[:14], *bufs[14:], 1024, 4096, 1, 1),
        "Launch, fixed_pointers": lambda: fixed((1, 1, 1), *bufs, 1024, 4096, 1, 1),
        "capturing?": torch.cuda.is_current_stream_capturing,
        "nn.Linear M=1": lambda: linear(xl),
    }
    for fn in fns.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            best[name] = min(best[name], _held(fn, calls))
    return {name: s * 1e6 for name, s in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    us = measure(a.calls, a.repeats)
    for name, v in us.items():
        print(f"{name:24s} {v:8.2f} µs per call")
    if a.json:
        a.json.write_text(json.dumps({
            "probe": "launch_pointer_cost", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(), "pointers": POINTERS,
            "calls": a.calls, "repeats": a.repeats, "host_us_per_call": us,
        }, indent=2))


if __name__ == "__main__":
    main()
