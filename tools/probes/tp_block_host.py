"""What one eager call of a tensor-parallel rank's MLP block asks of the host, part by part,
with no GPU: the block of ``quantcore.checkpoint.parallel`` (gate and up fused, the
activation, down, the all-reduce) as rank 0 of a world of 2 runs it, its two linears on
``hopper_wgmma``'s prepared state (the kernel the GPU binds) with the launches stubbed,
and the all-reduce through the group's own code path, the one-shot or the backend's.

What the stub replaces: the Triton launch of each linear (a no-op that takes the
arguments), the plan table (every call planned alike), and on the one-shot path the
symmetric buffer's allocation and rendezvous (a plain tensor) and the one-shot kernel (a
no-op CPU kernel registered for torch's own op, so the call goes through the dispatcher
as on a GPU). The backend path all-reduces through a gloo group of one process. Everything
else — the modules, the checks, the allocations, the path decision — runs as on a GPU,
except the activation: ``gated_activation`` runs torch's ops on a CPU (the split, SiLU,
the product) where on CUDA it runs its kernel (one output, one launch), so ``act`` here
is the CPU route. So the numbers are this CPU's Python and dispatcher work, not a GPU
host's µs (``quantcore bench tp_linear`` on two GPUs gives those).

Per part and block call (after warm calls): the aten ops it dispatches, the Python and
built-in functions it runs (``cProfile``'s count) and µs. Parts are measured through the
block's own methods, cumulatively: ``gate/up`` the fused layer's QuantLinear call,
``act`` what ``hidden(x)`` adds to it, ``down`` the row layer's QuantLinear call,
``all-reduce`` the group's ``all_reduce`` of the partial output, ``glue`` what the block
call adds to ``hidden`` + ``down`` + ``all-reduce``.

    python -m tools.probes.tp_block_host [--ms 1,16] [--paths one_shot,backend] [--calls 2000] [--json PATH]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from quantcore.checkpoint.allreduce import SymmetricMemory

from .launch_host_cost import interleaved

#: Hidden and intermediate size: the host's work does not depend on them.
K, INTER = 512, 1024
PARTS = ("gate/up", "act", "down", "all-reduce", "glue", "block")


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


class _NoLaunch:
    """Stands in for ``quantcore.triton.launch.Launch``: binds nothing, launches nothing."""

    def __init__(self, fn: Any, **kw: Any) -> None:
        pass

    def __call__(self, grid: Any, *args: Any) -> None:
        return None


class HostOnly(SymmetricMemory):
    """torch's symmetric memory with the buffer a plain tensor and no rendezvous; the
    one-shot call is torch's own (its op given a no-op CPU kernel in :func:`stubbed`)."""

    def unavailable(self) -> str:
        return ""

    def empty(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(numel, dtype=dtype, device=device)

    def rendezvous(self, buffer: torch.Tensor, group: Any) -> object:
        return None

    def agree(self, ok: bool, device: torch.device, group: Any) -> bool:
        return ok


@contextmanager
def stubbed() -> Iterator[Any]:
    """The stubs of the module docstring, and a gloo group of one process (the default
    group: the group yielded is None)."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory  # declares the symm_mem ops

    from quantcore.backends.hopper_wgmma import launch, small_m
    from quantcore.backends.hopper_wgmma.plans import Plan
    from quantcore.checkpoint.allreduce import AllReducer

    saved = [(launch, "Launch", launch.Launch), (small_m, "Launch", small_m.Launch), (launch, "plan_of", launch.plan_of),
             (AllReducer, "_local_unavailable", AllReducer._local_unavailable)]
    launch.Launch = small_m.Launch = _NoLaunch  # type: ignore[misc]
    plan = Plan(wg=1, bm=16, stages=4, split=1)
    launch.plan_of = lambda m, w, device: plan
    AllReducer._local_unavailable = lambda self, device: ""  # type: ignore[method-assign]
    lib = torch.library.Library("symm_mem", "IMPL")
    lib.impl("one_shot_all_reduce_copy_out", lambda buffer, src, op, group, out: out, "CPU")
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{Path(tmp) / 'store'}", rank=0, world_size=1)
        try:
            yield None  # the default group, as the bench's ranks use it
        finally:
            dist.destroy_process_group()
            lib._destroy()
            for owner, name, value in saved:
                setattr(owner, name, value)


def block(path: str, group: Any) -> Any:
    """Rank 0's GPTQ-4 block of a world of 2, its linears on hopper_wgmma's prepared state."""
    from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
    from quantcore.checkpoint.allreduce import AllReducer
    from quantcore.checkpoint.parallel import ParallelQuantMLP, TPGroup, fused_shard_tensors
    from quantcore.formats.gptq import GPTQ

    fmt = GPTQ(bits=4, group_size=128, sym=True)
    gen = torch.Generator().manual_seed(0)
    shapes = {"gate": (INTER, K), "up": (INTER, K), "down": (K, INTER)}
    layers = {name: fmt.quantize(torch.randn(*s, generator=gen) * 0.02) for name, s in shapes.items()}
    tp = TPGroup(0, 2, group, all_reduce_path=path)
    object.__setattr__(tp, "reducer", AllReducer(path, group=group, symm=HostOnly()))
    mlp = ParallelQuantMLP(fmt, layers, tp, device="cpu", dtype=torch.bfloat16)
    assert mlp.gate_up is not None
    _, fused = fused_shard_tensors(mlp.gate_up.shards)
    for layer, tensors in ((mlp.gate_up.local, fused), (mlp.down.local, mlp.down.shard.tensors)):
        kernel = HopperWgmmaGPTQ(fmt, "cpu")
        layer._adopt(kernel, kernel.prepare(tensors, dtype=torch.bfloat16))
    return mlp


def _ops(fn: Callable[[], object]) -> Counter[str]:
    fn()
    with _Ops() as seen:
        fn()
    return seen.ops


def _functions(fn: Callable[[], object], calls: int = 50) -> Counter[str]:
    """Functions one call runs, by ``file:line(name)``, counted over ``calls`` calls
    (the launch stub's call stands for the launcher's)."""
    fn()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    out: Counter[str] = Counter()
    for (path, line, name), v in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        ours = path == __file__ and name == "<lambda>"  # the probe's calls and the no-op kernel
        if not ours and name != "<method 'disable' of '_lsprof.Profiler' objects>":
            out[f"{Path(path).name}:{line}({name})"] += v[1] // calls
    return out


def measure(mlp: Any, m: int, calls: int, repeats: int) -> dict[str, dict[str, Any]]:
    """Per part: ``ops`` (aten op counts), ``functions`` (by name), ``us``."""
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m)).bfloat16()
    assert mlp.gate_up is not None
    gate_up, down = mlp.gate_up.local, mlp.down.local
    h, p = mlp.hidden(x), mlp.partial(x)
    steps: dict[str, Callable[[], object]] = {
        "gate/up": lambda: gate_up(x), "hidden": lambda: mlp.hidden(x), "down": lambda: down(h),
        "all-reduce": lambda: mlp.tp.all_reduce(p), "block": lambda: mlp(x)}
    ops = {k: _ops(f) for k, f in steps.items()}
    fns = {k: _functions(f) for k, f in steps.items()}
    us = {name: 1e6 * t for name, t in interleaved(steps, calls, repeats).items()}
    out = {k: {"ops": ops[k], "functions": fns[k], "us": us[k]} for k in ("gate/up", "down", "all-reduce", "block")}
    out["act"] = {"ops": ops["hidden"] - ops["gate/up"], "functions": fns["hidden"] - fns["gate/up"],
                  "us": us["hidden"] - us["gate/up"]}
    inner = [ops["hidden"], ops["down"], ops["all-reduce"]]
    inner_f = [fns["hidden"], fns["down"], fns["all-reduce"]]
    out["glue"] = {"ops": ops["block"] - sum(inner, Counter()), "functions": fns["block"] - sum(inner_f, Counter()),
                   "us": us["block"] - us["hidden"] - us["down"] - us["all-reduce"]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.probes.tp_block_host")
    p.add_argument("--ms", default="1,16", help="activation rows, comma-separated")
    p.add_argument("--paths", default="one_shot,backend", help="all-reduce paths, comma-separated")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--label", default="this tree")
    p.add_argument("--functions", action="store_true", help="list every function of each part")
    p.add_argument("--json", type=Path, help="append the numbers to this JSON list")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, Any] = {"label": args.label, "torch": torch.__version__, "cases": {}}
    with stubbed() as group, torch.no_grad():
        for path in args.paths.split(","):
            mlp = block(path, group)
            for m in (int(v) for v in args.ms.split(",")):
                got = measure(mlp, m, args.calls, args.repeats)
                results["cases"][f"{path}/M{m}"] = {
                    k: {"ops": dict(v["ops"]), "n_ops": sum(v["ops"].values()),
                        "n_functions": sum(v["functions"].values()), "us": v["us"]} for k, v in got.items()}
                print(f"\n{path} all-reduce, M = {m}: {'part':10s} {'aten ops':>8s} {'functions':>9s} {'µs':>7s}  ops")
                for part in PARTS:
                    v = got[part]
                    print(f"{'':30s} {part:10s} {sum(v['ops'].values()):8d} {sum(v['functions'].values()):9d} "
                          f"{v['us']:7.2f}  {dict(sorted(v['ops'].items()))}")
                    if args.functions:
                        for name, n in sorted(v["functions"].items()):
                            print(f"{'':42s}{n:3d}× {name}")
    if args.json:
        runs = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([*runs, results], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
