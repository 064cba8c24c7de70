"""What one eager call of a tensor-parallel rank's MLP block asks of the host
(quantcore/checkpoint/parallel.py, allreduce.py) — each aten op and Python frame costs the
host microseconds on a GPU, where a rank's block should cost its launches: per part, with
the linears on ``hopper_wgmma``'s prepared state and their launches recorded (no GPU), and
the one-shot all-reduce through torch's own op (a no-op CPU kernel stands in for it):

* gate/up: its QuantLinear's output and launch; gate/up and the activation: one call of
  ``QuantLinear.gated``, which on ``hopper_wgmma`` is one launch of the same plan ending
  gated: its output and (on a CPU; on CUDA they are kept per stream) the workspace and the
  pair counters (``tests/hopper_wgmma/test_gated.py``); down: its output and launch;
* the all-reduce: its output and the op — its path and view of the buffer bound per
  message shape, the op per group;
* between them: nothing but the block's own three methods.

And what the binding must not change: the block's outputs (its layers called one by one,
bit for bit), each message's path when the group's buffers or refusals change, the copy
of an input off the buffer's alignment, the kernel's refusal of a wrong activation."""

from __future__ import annotations

import cProfile
import pstats
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from quantcore.backends.hopper_wgmma import launch, small_m
from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.plans import Plan
from quantcore.checkpoint.allreduce import AllReducer
from quantcore.checkpoint.parallel import ParallelQuantMLP, TPGroup, fused_shard_tensors
from quantcore.conformance.tp.processes import mlp_layers
from quantcore.errors import KernelInputError
from quantcore.formats.gptq import GPTQ
from tests.aten_ops import ops_of_call
from tests.gc_held import gc_held
from tests.launch_recorder import Recorder, record_launches
from tests.tp.symm_fake import FakeSymm
from tools.probes.tp_block_host import HostOnly

HIDDEN, INTER = 256, 512
FMT = GPTQ(bits=4, group_size=128, sym=True)
ROOT = Path(__file__).resolve().parents[2]
#: A group as the one-shot op is bound to it: only its name is read.
GROUP = types.SimpleNamespace(group_name="tp")


def _roles(fmt: GPTQ = FMT) -> dict[str, dict[str, torch.Tensor]]:
    return {k.rsplit(".", 1)[1].removesuffix("_proj"): v for k, v in mlp_layers(fmt, HIDDEN, INTER).items()}


@pytest.fixture
def one_shot_op() -> Any:
    """torch's one-shot op with a CPU kernel that writes nothing (its call is what counts)."""
    import torch.distributed._symmetric_memory  # declares the symm_mem ops

    lib = torch.library.Library("symm_mem", "IMPL")
    lib.impl("one_shot_all_reduce_copy_out", lambda buffer, src, op, group, out: out, "CPU")
    yield
    lib._destroy()


@pytest.fixture
def block(monkeypatch: pytest.MonkeyPatch, one_shot_op: Any) -> ParallelQuantMLP:
    """Rank 0 of 2: gate/up fused, the linears on hopper_wgmma (launches recorded), the
    one-shot all-reduce through torch's op."""
    record_launches(monkeypatch, launch)
    monkeypatch.setattr(small_m, "Launch", Recorder)
    plan = Plan(wg=1, bm=16, stages=4, split=1)
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plan)
    monkeypatch.setattr(AllReducer, "_local_unavailable", lambda self, device: "")  # as an NCCL group on CUDA
    tp = TPGroup(0, 2, GROUP, all_reduce_path="one_shot")
    object.__setattr__(tp, "reducer", AllReducer("one_shot", group=GROUP, symm=HostOnly()))
    mlp = ParallelQuantMLP(FMT, _roles(), tp, device="cpu")
    assert mlp.gate_up is not None
    _, fused = fused_shard_tensors(mlp.gate_up.shards)
    for layer, tensors in ((mlp.gate_up.local, fused), (mlp.down.local, mlp.down.shard.tensors)):
        kernel = HopperWgmmaGPTQ(FMT, "cpu")
        layer._adopt(kernel, kernel.prepare(tensors, dtype=torch.bfloat16))
    return mlp


def _steps(mlp: ParallelQuantMLP, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    assert mlp.gate_up is not None
    gate_up, down = mlp.gate_up.local, mlp.down.local
    with torch.no_grad():
        h, p = mlp.hidden(x), mlp.partial(x)
    return {"gate/up": lambda: gate_up(x), "hidden": lambda: mlp.hidden(x), "down": lambda: down(h),
            "all-reduce": lambda: mlp.tp.all_reduce(p), "block": lambda: mlp(x)}


def _python_frames(call: Callable[[], object], calls: int = 3) -> Counter[str]:
    """The Python functions (no built-ins) one call runs, by ``file(name)``: the
    repository's by their path in it, torch's by their file's name."""
    with torch.no_grad(), gc_held():
        call()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            call()
        profile.disable()
    out: Counter[str] = Counter()
    for (path, _, name), v in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        if path == "~" or (path == __file__ and name == "<lambda>"):  # built-ins; this test's calls
            continue
        where = Path(path).resolve()
        label = str(where.relative_to(ROOT)) if where.is_relative_to(ROOT) else where.name
        out[f"{label}({name})"] += v[1] // calls
    return out


@pytest.mark.parametrize("m", [1, 16])
def test_a_block_call_asks_for_each_parts_ops_and_nothing_between(block: ParallelQuantMLP, m: int) -> None:
    x = torch.randn(m, HIDDEN).bfloat16()
    ops = {name: ops_of_call(step) for name, step in _steps(block, x).items()}
    assert ops["gate/up"] == Counter({"empty": 1})
    # the gated end: its output, the workspace and the pair counters (made per call on a CPU only)
    assert ops["hidden"] == Counter({"empty": 2, "zeros": 1})
    assert ops["down"] == Counter({"empty": 1})
    assert ops["all-reduce"] == Counter({"empty_like": 1, "one_shot_all_reduce_copy_out": 1})
    assert ops["block"] == ops["hidden"] + ops["down"] + ops["all-reduce"]


def test_a_block_calls_its_parts_and_the_all_reduce_only_its_op(block: ParallelQuantMLP) -> None:
    steps = _steps(block, torch.randn(1, HIDDEN).bfloat16())
    frames = {name: _python_frames(step) for name, step in steps.items()}
    assert frames["all-reduce"] == Counter({
        "quantcore/checkpoint/parallel.py(all_reduce)": 1, "quantcore/checkpoint/allreduce.py(__call__)": 1,
        "quantcore/checkpoint/allreduce.py(_one_shot)": 1, "_ops.py(__call__)": 1})
    # The gated call takes the plain call's launch path from the bucket on (no activation
    # launch); what it adds and what it skips of the module's call:
    hidden, gate_up = frames["hidden"], frames["gate/up"]
    assert hidden - gate_up == Counter({
        "quantcore/checkpoint/parallel.py(hidden)": 1, "module.py(__getattr__)": 2,
        "quantcore/nn/quant_module.py(runs_hooks)": 2, "quantcore/nn/linear.py(gated)": 1,
        "backends/hopper_wgmma/kernel.py(gated)": 1, "backends/hopper_wgmma/launch.py(gated_linear)": 1})
    assert gate_up - hidden == Counter({
        "module.py(_call_impl)": 1, "module.py(_wrapped_call_impl)": 1, "quantcore/nn/quant_module.py(forward)": 1,
        "quantcore/kernels/gptq_pairs/kernel.py(__call__)": 1, "backends/hopper_wgmma/launch.py(linear)": 1})
    between = frames["block"] - frames["hidden"] - frames["down"] - frames["all-reduce"]
    ours = Counter({k: v for k, v in between.items() if k.startswith("quantcore/")})
    assert ours == Counter({"quantcore/checkpoint/parallel.py(forward)": 1,
                            "quantcore/checkpoint/parallel.py(partial)": 1})
    # the two linears are the same call of the same module class: what one costs, twice
    assert frames["block"] - frames["hidden"] - frames["all-reduce"] - between == frames["down"]


def test_the_block_gives_its_layers_outputs_called_one_by_one_bit_for_bit() -> None:
    named = _roles()
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(7)).bfloat16()
    silu = torch.nn.functional.silu
    with torch.no_grad():
        for world in (1, 2):
            for rank in range(world):
                for fuse in (True, False):
                    mlp = ParallelQuantMLP(FMT, named, TPGroup(rank, world), device="cpu", fuse_gate_up=fuse)
                    cols = mlp.gate_up(x) if mlp.gate_up is not None else {"gate": mlp.gate(x), "up": mlp.up(x)}
                    h = silu(cols["gate"]) * cols["up"]
                    assert torch.equal(mlp.hidden(x), h), (world, rank, fuse)
                    assert torch.equal(mlp.partial(x), mlp.down.partial(h)), (world, rank, fuse)
        del named["gate"]
        for act, fn in (("relu", torch.relu), ("gelu", torch.nn.functional.gelu), ("silu", silu)):
            mlp = ParallelQuantMLP(FMT, named, TPGroup(1, 2), activation=act, device="cpu")
            assert torch.equal(mlp.partial(x), mlp.down.partial(fn(mlp.up(x)))), act


def test_a_bound_message_follows_the_groups_refusal_and_takes_the_smallest_buffer(monkeypatch) -> None:
    monkeypatch.setattr(AllReducer, "_local_unavailable", lambda self, device: "")
    backend: list[torch.Tensor] = []
    monkeypatch.setattr(AllReducer, "_backend", lambda self, t: backend.append(t) or t.mul_(2))
    symm = FakeSymm()
    red = AllReducer("auto", symm=symm)
    x = torch.randn(1, 4096).bfloat16()
    assert torch.equal(red(x), x * 2) and torch.equal(red(x.clone()), x * 2)
    assert len(symm.calls) == 2 and backend == [] and len(symm.bound) == 1  # the op bound once
    symm.fail = True  # a new dtype's rendezvous fails: every rank agrees auto falls back for good
    y = torch.randn(1, 4096)
    assert red(y) is y and backend == [y]
    again = x.clone()
    assert red(again) is again and backend == [y, again]  # the bf16 shape bound before goes with it
    assert len(symm.calls) == 2

    forced = AllReducer("one_shot", symm=(symm := FakeSymm()))
    small, big = torch.randn(1, 4096).bfloat16(), torch.randn(256, 4096).bfloat16()
    forced(small)
    forced(big)  # past the first buffer: a second, larger one
    forced(small)
    assert len(symm.made) == 2 and symm.made[1].numel() > symm.made[0].numel()
    first = symm.made[0].untyped_storage().data_ptr()
    assert [c[0].untyped_storage().data_ptr() == first for c in symm.calls] == [True, False, True]


def test_an_input_off_the_alignment_is_copied_though_its_shape_is_bound(monkeypatch) -> None:
    monkeypatch.setattr(AllReducer, "_local_unavailable", lambda self, device: "")
    red = AllReducer("one_shot", symm=(symm := FakeSymm()))
    base = torch.randn(2, 4096).bfloat16()
    assert torch.equal(red(base[:1]), base[:1] * 2)
    off = base.view(-1)[1:4097].view(1, 4096)  # the bound shape, 2 bytes off the buffer's alignment
    assert torch.equal(red(off), off * 2)
    assert symm.calls[-1][1].data_ptr() != off.data_ptr()  # staged from a copy


def test_the_block_still_refuses_a_wrong_activation_naming_it(block: ParallelQuantMLP) -> None:
    block(torch.randn(1, HIDDEN).bfloat16())
    with pytest.raises(KernelInputError, match=str(HIDDEN)):
        block(torch.randn(1, HIDDEN + 32).bfloat16())
    with pytest.raises(KernelInputError, match="float32"):
        block(torch.randn(1, HIDDEN))


def test_a_hook_on_a_column_wrapper_still_runs_and_changes_nothing_else() -> None:
    """A forward hook registered on the gate/up wrapper (or a global one) sends the call
    through the wrappers, so the hook runs; the output is the same bits."""
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(8)).bfloat16()
    mlp = ParallelQuantMLP(FMT, _roles(), TPGroup(0, 2), device="cpu")
    assert mlp.gate_up is not None
    seen: list[int] = []
    with torch.no_grad():
        plain = mlp.partial(x)
        handle = mlp.gate_up.register_forward_hook(lambda m, args, out: seen.append(1))
        try:
            assert torch.equal(mlp.partial(x), plain) and seen == [1]
        finally:
            handle.remove()
        glob = torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: seen.append(2))
        try:
            assert torch.equal(mlp.partial(x), plain) and 2 in seen
        finally:
            glob.remove()
        assert torch.equal(mlp.partial(x), plain) and seen.count(1) == 1
