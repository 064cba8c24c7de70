"""Where a step of the ``model_decode`` suite spends its time, by part of the model: the
linears, attention, norms, the LM head, the embedding, sampling, other element-wise work
and copies, and the gaps in which the device waits for the host — so a missed target can
be explained from a trace (``torch.profiler``).

    python -m quantcore.benchmarks.decode_profile --shapes b1 \\
        [--variants bf16,gptq4-g128-fused] [--steps 8] [--out DIR] [--trace]

The suite's models and harness are used as they are: for a decode case ``--steps``
decode steps (compiled unless the case is ``eager``), for a prefill case as many
prefills; each step is launched by the host, not replayed from a CUDA graph, so the gaps
show what a graph would remove. On CUDA each kernel's (and copy's) time goes to the part
of the op that launched it (a ``quantcore::linear`` op, a matmul whose shapes hold the
vocabulary, an attention op …) or, where the ops around its launch name no part — in a
compiled step a kernel's launcher is an inductor-generated function or nothing —, to the
part its own name tells: inductor names a kernel after the ops it fuses (``…rsqrt…``: a
norm), GEMM libraries and quantcore's kernels after themselves (``nvjet_…``, ``…gemm…``,
``wgmma_kernel``: the linears). Each kernel counts once, as the device event it is; the
ranges ``record_function`` puts around code appear on the device timeline too, spanning
the kernels launched inside them, and count for nothing (docs/benchmarks.md, "How the
profile reads a trace"). An instant in which several kernels run at once (programmatic
dependent launch starts a kernel before its predecessor ends, docs/pdl.md) counts to each
a share, so the parts and the gaps add up to the span of the steps' kernels, within the
wall time; the gaps are that span minus the time some kernel ran.
Where only kernel names tell a GEMM apart, the LM head is not told from the linears: its
part reads ``None`` ("in linears" in the table). On the CPU the parts are the ops' own
time, and what is left of the wall time is the host's time outside ops. ``--out`` gets
one JSON per case (and a chrome trace per variant with ``--trace``).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quantcore.nn.quant_module import QuantModule

from .decode import Decoder, Prefill
from .suites import model_decode

__all__ = ["PARTS", "attribute", "main", "profile_case"]

PARTS = ("linears", "attention", "norms", "lm_head", "embedding", "sampling", "other")
#: The profiler range an eager run puts around a module's call: ``part: linears`` ….
_RANGE = "part: "
_MATMUL = re.compile(r"^aten::(mm|addmm|linear|matmul)$")
#: (part, what an op's name contains), tried in order.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"scaled_dot_product|flash|efficient_attention|fmha|attention", re.I)),
    ("linears", re.compile(r"quantcore|_weight_int4pack_mm|^aten::(mm|addmm|linear|matmul|bmm)$")),
    ("norms", re.compile(r"rsqrt|rms_norm|layer_norm|^aten::(pow|mean)$", re.I)),
    ("embedding", re.compile(r"embedding", re.I)),
    ("sampling", re.compile(r"argmax", re.I)),
)
#: (part, what a device kernel's name contains), tried in order, for a kernel whose
#: launching ops name no part. GEMMs: cuBLAS (``nvjet_…``, ``sm90_xmma_gemm_…``, ``…gemv…``,
#: ``cublasLt::splitKreduce…``), CUTLASS, tinygemm (``tinygemm_m16n8k16_…``), inductor's
#: matmul templates (``triton_tem_fused_mm_0``) and quantcore's Triton and Gluon kernels
#: (backends/ and quantcore/kernels/: ``wgmma_kernel``, ``gemv_kernel``, ``mma_kernel``,
#: ``dequant_kernel`` and ``rotate_kernel`` before a GEMM, the MoE and SVDQuant kernels).
_KERNEL_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("linears", re.compile(r"gemm|gemv|nvjet|cutlass|cublas|^triton_tem_|gptq_pairs|_mma|wgmma|"
                           r"^(mma|dequant|rotate|act_quant_lora|moe_w8a16|route_schedule)_kernel", re.I)),
    ("norms", re.compile(r"rsqrt|rms_norm|layer_norm", re.I)),
    ("embedding", re.compile(r"embedding", re.I)),
    ("sampling", re.compile(r"argmax", re.I)),
)
#: The device events that are the device's own work (``activity_type``); the others are
#: ``gpu_user_annotation`` (a ``record_function`` range drawn over the kernels launched
#: inside it) and ``cuda_sync`` (the host waiting), spans over work already counted
#: (docs/benchmarks.md, "How the profile reads a trace").
_DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
#: CPU events the profiler takes from the CUDA runtime and driver, not ops: their ids
#: are the driver's correlation ids (a kernel's own id is its launch's), another numbering
#: than the ids of ops, which a kernel's ``linked_correlation_id`` names.
_RUNTIME = frozenset({"cuda_runtime", "cuda_driver", "overhead"})


def _part_of(names: Sequence[str], shapes: Sequence[Any], vocab: int) -> str | None:
    """The innermost module range (``part: …``, eager runs) around an op, else the part
    of the first op name, outermost first, that a rule knows; a matmul whose shapes hold
    the vocabulary is the LM head."""
    for name in reversed(names):
        if name.startswith(_RANGE):
            return name[len(_RANGE):]
    for name, shape in zip(names, shapes, strict=True):
        if _MATMUL.match(name) and any(vocab in (s or ()) for s in shape or ()):
            return "lm_head"
        for part, pattern in _RULES:
            if pattern.search(name):
                return part
    return None


def _kernel_part(name: str) -> str | None:
    for part, pattern in _KERNEL_RULES:
        if pattern.search(name):
            return part
    return None


def _chain(event: Any) -> tuple[list[str], list[Any]]:
    """Names and input shapes from the outermost enclosing op down to ``event``."""
    names, shapes = [], []
    while event is not None:
        names.append(event.name)
        shapes.append(getattr(event, "input_shapes", None))
        event = event.cpu_parent
    return names[::-1], shapes[::-1]


def _launcher_of(events: Sequence[Any]) -> Callable[[Any], Any]:
    """A device event → the CPU event that launched it: the op its
    ``linked_correlation_id`` names (what torch's own tables use), else the runtime call
    with its correlation id (``cudaLaunchKernel``, ``cuLaunchKernelEx`` …), whose enclosing
    ops are those around the launch — the only way to the ``part: …`` ranges of an eager
    run, which link no kernel. The two numberings overlap, so each has its own table."""
    from torch.autograd import DeviceType

    ops, calls = {}, {}
    for e in events:
        if e.device_type == DeviceType.CPU:
            runtime = getattr(e, "activity_type", None) in _RUNTIME or getattr(e, "linked_correlation_id", 0)
            (calls if runtime else ops)[e.id] = e

    def launcher(kernel: Any) -> Any:
        link, own = getattr(kernel, "linked_correlation_id", 0), getattr(kernel, "id", 0)
        return (ops.get(link) if link else None) or (calls.get(own) if own else None)

    return launcher


def _is_work(event: Any) -> bool:
    kind = getattr(event, "activity_type", None)
    return not getattr(event, "is_user_annotation", False) and (kind is None or kind in _DEVICE_WORK)


def _shares(spans: Sequence[tuple[float, float, str]]) -> tuple[dict[str, float], float]:
    """Each part's time out of ``(start, end, part)`` spans, and the time some span ran:
    an instant in which n spans run at once counts 1/n to each, so the parts add up to the
    busy time, whatever overlaps."""
    edges = sorted([(a, 1, p) for a, _, p in spans] + [(b, -1, p) for _, b, p in spans])
    parts: dict[str, float] = defaultdict(float)
    running: dict[str, int] = defaultdict(int)
    busy, total, last = 0.0, 0, 0.0
    for t, step, part in edges:
        if total:
            busy += t - last
            for p, n in running.items():
                if n:
                    parts[p] += (t - last) * n / total
        running[part] += step
        total += step
        last = t
    return dict(parts), busy


def attribute(events: Sequence[Any], vocab: int, *, steps: int, wall_s: float) -> dict[str, float | None]:
    """Milliseconds per step of each part, plus ``gaps`` (CUDA: the device idle within
    the span of the steps' kernels) or ``host`` (CPU: wall time outside every op). On
    CUDA the parts and gaps add up to that span; ``lm_head`` is None where a GEMM was
    known by its kernel's name alone (the LM head's time is then in ``linears``)."""
    from torch.autograd import DeviceType

    device = [e for e in events if e.device_type == DeviceType.CUDA and _is_work(e)]
    parts: dict[str, float] = defaultdict(float)
    head_unseen = False
    if device:
        launcher = _launcher_of(events)
        spans = []
        for k in device:
            names, shapes = _chain(launcher(k))
            part = _part_of(names, shapes, vocab)
            if part is None:
                part = _kernel_part(k.name) or "other"
                head_unseen |= part == "linears"  # no op's shapes to tell the LM head by
            spans.append((k.time_range.start, k.time_range.end, part))
        shares, busy = _shares(spans)
        parts.update(shares)
        parts["gaps"] = max(b for _, b, _ in spans) - min(a for a, _, _ in spans) - busy
    else:
        for e in events:
            if e.device_type != DeviceType.CPU or "::" not in e.name:
                continue
            names, shapes = _chain(e)
            parts[_part_of(names, shapes, vocab) or "other"] += e.self_cpu_time_total
        parts["host"] = max(0.0, wall_s * 1e6 - sum(parts.values()))
    out: dict[str, float | None] = {p: round(us / 1e3 / steps, 4) for p, us in parts.items()}
    if head_unseen and not out.get("lm_head"):
        out["lm_head"] = None
    return out


def _module_part(name: str, module: nn.Module) -> str | None:
    kind = type(module).__name__
    if isinstance(module, nn.Linear):
        return "lm_head" if name.rpartition(".")[2] == "lm_head" else "linears"
    if isinstance(module, QuantModule) or kind == "FusedSlice":
        return "linears"
    if kind.endswith(("RMSNorm", "LayerNorm")):
        return "norms"
    if kind.endswith("Attention"):  # what its projections (inner ranges) leave: rotary, cache, attention
        return "attention"
    if isinstance(module, nn.Embedding):
        return "embedding"
    return None


def _annotate(model: nn.Module) -> Callable[[], None]:
    """Eager runs: a profiler range around each call of a module of a known part (eager
    calls of quantcore's modules skip the dispatcher, so no op would name them). Returns
    the undo."""
    open_ranges: list[Any] = []
    handles = []
    for name, module in model.named_modules():
        part = _module_part(name, module)
        if part is None:
            continue

        def enter(module: nn.Module, args: Any, part: str = part) -> None:
            rf = torch.profiler.record_function(_RANGE + part)
            rf.__enter__()
            open_ranges.append(rf)

        def leave(module: nn.Module, args: Any, out: Any) -> None:
            open_ranges.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]

    def undo() -> None:
        for handle in handles:
            handle.remove()

    return undo


def profile_case(dims: dict[str, int], device: str, names: Sequence[str], *, steps: int = 8,
                 trace_dir: Path | None = None) -> dict[str, Any]:
    """Profile ``steps`` steps of each variant of one case of the suite."""
    what = model_decode.kind(dims)
    out: dict[str, Any] = {"case": model_decode.label(dims), "dims": dims, "steps": steps, "variants": {}}
    for name in names:
        model = model_decode.variant_model(name, dims, device)
        if what == "prefill":
            runner: Decoder | Prefill = Prefill(model, batch=dims["B"], prompt=dims["P"], device=device)
            step: Callable[[int], object] = runner.first_token
        else:
            runner = Decoder(model, batch=dims["B"], prompt=dims["P"], new_tokens=max(dims["T"], steps),
                             device=device, compile=what == "decode")
            step = runner.step
        runner.warm_up()
        if isinstance(runner, Decoder):
            runner.restart()
        undo = _annotate(model) if what == "eager" else (lambda: None)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.startswith("cuda"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
            start = time.perf_counter()
            for i in range(steps):
                step(i)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
        undo()
        parts = attribute(prof.events(), dims["V"], steps=steps, wall_s=wall)
        out["variants"][name] = {"wall_ms_per_step": round(wall * 1e3 / steps, 4), "parts_ms_per_step": parts,
                                 "kernels": model_decode.kernels_of(model)}
        if trace_dir is not None:
            trace_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace_dir / f"{out['case']}-{name}.trace.json"))
    return out


#: The table's cell for an LM head that kernel names could not tell from the linears.
_HEAD_IN_LINEARS = "in linears"


def table(result: dict[str, Any]) -> str:
    from tabulate import tabulate

    rows = []
    for name, v in result["variants"].items():
        parts = v["parts_ms_per_step"]
        idle = "gaps" if "gaps" in parts else "host"
        cells = [_HEAD_IN_LINEARS if parts.get(p, 0.0) is None else f"{parts.get(p, 0.0):.3f}" for p in (*PARTS, idle)]
        rows.append([name, f"{v['wall_ms_per_step']:.3f}", *cells, v["kernels"]])
    headers = ["variant", "wall ms/step", *PARTS, "gaps / host", "kernels"]
    return f"{result['case']} (ms per step)\n" + tabulate(rows, headers=headers, disable_numparse=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="b1", help=f"a shape set of model_decode: {sorted(model_decode.SHAPES)}")
    parser.add_argument("--variants", default="", help="comma-separated (default: the suite's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, help="folder for the JSON (and traces)")
    parser.add_argument("--trace", action="store_true", help="also write a chrome trace per variant")
    args = parser.parse_args(argv)
    if args.shapes not in model_decode.SHAPES:
        parser.error(f"--shapes: expected one of {sorted(model_decode.SHAPES)}, got {args.shapes!r}")
    names = [n.strip() for n in args.variants.split(",") if n.strip()] or model_decode.variant_names()
    for dims in model_decode.SHAPES[args.shapes]:
        runnable = [n for n in names if model_decode.RECIPES[n].needs is None
                    or args.device.startswith(model_decode.RECIPES[n].needs[0])]  # type: ignore[index]
        result = profile_case(dict(dims), args.device, runnable, steps=args.steps,
                              trace_dir=args.out / "traces" if args.out and args.trace else None)
        print(table(result))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"profile-{result['case']}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
