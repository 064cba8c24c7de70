"""trtllm_moe: the routed GEMM1 of an MoE (E experts, top-k) with INT8 group-wise weights,
every registered kernel that can run here vs a bf16 MoE of one cuBLAS matmul per touched
expert (tokens pre-sorted by expert, the sort not timed).

Kernels are timed through ``forward`` where they have one (the call without validating
the expert ids, which would wait for the GPU), else through ``__call__``. The
Triton kernel's tile sweep (each tile checked against a reference, then timed) is
``python -m tools.probes.trtllm_moe_tiles`` (from the repository root); its H100 results are in
``benchmarks/results/trtllm_moe-NVIDIA-H100-80GB-HBM3.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.ops.moe import moe_problem
from quantcore.registry import default_registry
from quantcore.selection import explain

from ..choice import default_choice
from ..memory import rotation_sets
from ..spec import BenchCase, Variant

DESCRIPTION = "trtllm_moe INT8 g128 MoE GEMM1: registered kernels vs bf16 per-expert cuBLAS"
_SEED = {"E": 8, "topk": 2, "K": 4096, "N": 28672}
SHAPES = {
    "default": [{"T": t, **_SEED} for t in (1, 16, 64, 512, 4096)],
    "decode": [{"T": t, **_SEED} for t in (1, 16)],
    "prefill": [{"T": t, **_SEED} for t in (512, 4096)],
    "small": [{"T": t, "E": 8, "topk": 2, "K": 256, "N": 512} for t in (1, 16)],
    # Sized for a CPU: the reference model's expert count and routing, a tenth of its K and N.
    "cpu": [{"T": t, "E": 8, "topk": 2, "K": 512, "N": 2048} for t in (1, 16, 64, 512, 2048)],
}
FMT = TRTLLMMoE(group_size=128, sym=True, scale_dtype=torch.bfloat16)
DTYPE = torch.bfloat16


def problems(shapes: list[dict[str, int]]) -> list[Any]:
    """The problems the suite's cases time (``quantcore tune --suite``)."""
    return [moe_problem(FMT, **{d: s[d] for d in ("T", "E", "topk", "K", "N")}, dtype=DTYPE) for s in shapes]


def _routing(t: int, e: int, topk: int, dev: torch.device, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(t, e, generator=gen, device=gen.device).argsort(dim=1)[:, :topk].to(torch.int32).to(dev)


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    dev = torch.device(device)
    # Drawn on the device: the reference 8 × 4096 × 28672 weights take seconds on a CPU.
    gen = torch.Generator(device=dev).manual_seed(0)
    on = {"generator": gen, "device": dev}
    for dims in shapes:
        t, e, topk, k, n = (dims[d] for d in ("T", "E", "topk", "K", "N"))
        case = BenchCase("trtllm_moe", f"T{t}-E{e}-top{topk}-K{k}-N{n}", dict(dims))
        ids = _routing(t, e, topk, dev, gen)
        touched = int(torch.unique(ids).numel())
        sets = rotation_sets(touched * k * n, device)
        xs = [torch.randn(t, k, **on).to(DTYPE) for _ in range(sets)]
        flops = 2 * t * topk * k * n
        act_bytes = 2 * (t * k + t * topk * n)
        weights = [{
            "qweight": torch.randint(-128, 128, (e, k, n), dtype=torch.int8, **on),
            "scales": (torch.rand(e, k // FMT.group_size, n, **on) * 2e-4 + 1e-4).to(DTYPE),
        } for _ in range(sets)]
        problem = moe_problem(FMT, T=t, E=e, topk=topk, K=k, N=n, dtype=DTYPE)
        chosen = default_choice(FMT, device, problem)
        for cand in explain(FMT, device, problem=problem).candidates:
            if cand.status not in ("selected", "usable"):
                if cand.status != "broken":
                    case.skipped[cand.kernel] = f"{cand.status}: {cand.reason}"
                continue
            kernel = default_registry().kernel(FMT.name, "moe", cand.kernel).cls(FMT, dev)
            prepared = [kernel.prepare(w, dtype=DTYPE) for w in weights]
            call = getattr(kernel, "forward", kernel)
            nbytes = touched * (k * n + 2 * n * k // FMT.group_size) + act_bytes
            case.variants.append(Variant(cand.kernel, "kernel", _call(call, xs, ids, prepared), nbytes, flops, sets,
                                         candidate=FMT.slug, keeps_dense=cand.keeps_dense,
                                         chosen=cand.kernel == chosen))
        del weights
        dense = [torch.randn(e, n, k, **on).to(DTYPE) for _ in range(rotation_sets(2 * touched * k * n, device))]
        case.variants.append(Variant(
            "bf16_per_expert", "peer", _per_expert_peer(xs, ids, dense), 2 * touched * k * n + act_bytes, flops,
            len(dense), "cuBLAS" if dev.type == "cuda" else "",
        ))
        yield case


def _call(call: Callable[..., Any], xs: list[torch.Tensor], ids: torch.Tensor, prepared: list[Any]) -> Callable[[int], Any]:
    return lambda i: call(xs[i % len(xs)], ids, prepared[i % len(prepared)])


def _per_expert_peer(xs: list[torch.Tensor], ids: torch.Tensor, dense: list[torch.Tensor]) -> Callable[[int], Any]:
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    topk = ids.shape[1]
    sorted_xs = [x.repeat_interleave(topk, dim=0)[order].contiguous() for x in xs]
    counts = torch.bincount(flat, minlength=dense[0].shape[0]).tolist()
    segments, start = [], 0
    for e, c in enumerate(counts):
        if c:
            segments.append((e, start, start + c))
            start += c
    out = torch.empty(flat.numel(), dense[0].shape[1], dtype=DTYPE, device=ids.device)

    def run(i: int) -> torch.Tensor:
        x, w = sorted_xs[i % len(sorted_xs)], dense[i % len(dense)]
        for e, a, b in segments:
            torch.mm(x[a:b], w[e].t(), out=out[a:b])
        return out

    return run


#: The targets: minimum speed-up over bf16 per-expert cuBLAS per T (same run), and
#: the share of copy bandwidth decode must reach on the touched experts' bytes.
TARGETS = {1: 1.8, 16: 1.8, 64: 1.7, 512: 1.0, 4096: 0.9}
DECODE_COPY_SHARE = 0.8


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    """Each T against the issue's targets: speed-up over bf16, and for decode (T <= 16)
    the share of copy bandwidth on the touched experts' bytes."""
    notes = []
    for r in rows:
        if r["variant"] != "trtllm_moe_triton" or r["role"] != "kernel":
            continue
        t, speed = r["dims"]["T"], r["speedup_vs"].get("bf16_per_expert", 0.0)
        target = TARGETS.get(t)
        if target is None:
            continue
        ok = speed >= target
        line = f"{r['case']}: {speed:.2f}× bf16 (target ≥ {target}×)"
        if t <= 16:
            ok = ok and r["copy_share"] >= DECODE_COPY_SHARE
            line += f", {r['copy_share']:.0%} of copy (target ≥ {DECODE_COPY_SHARE:.0%})"
        notes.append(f"{line}: {'met' if ok else 'missed'}")
    return notes
