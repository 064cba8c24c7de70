"""TurboQuant's linear on ``hopper_wgmma``'s kernel (its ``LOOKUP`` operand: the codebook
centroid times the group scale, ``backends/hopper_wgmma/codebook.py``), beside what runs it
today (an sm_90 GPU, one call).

The layer's passes become one 4-bit code matrix of depth P·K in ``hopper_wgmma``'s layout
(``tq_to_hopper``: each pass's codes and float32 scales ``norms/√d`` interleaved group by
group, as ``turboquant_triton``'s dequantize path stacks them), and x is rotated before the
launch into the same interleaving by the one GEMM ``turboquant_triton`` runs (``rotated``).
Per (K, N, M):

* checked: every plan against the float64 golden at the conformance tolerance of bf16;
  then with a dyadic codebook, power-of-two scales, a signed-permutation rotation and
  integer x (every product and sum exact) bit for bit the golden rounded once — which
  checks the inline PTX: the fields' shifts, the pairing, the scale per row. A failure
  prints ``FAIL``, is not timed, and makes the exit status 1;
* timed (CUDA-graph replays, weight sets beyond L2, one process): the whole op per plan
  (rotation + launch; ``decode,SPLIT`` is the warp-level decode kernel, at most 16 rows),
  the rotation alone, ``turboquant_triton``'s call and cuBLAS bf16.

    python -m tools.probes.turboquant_hopper [--ms 1,16,64,128] [--shapes 4096x14336,…] [--residual] \\
        [--plans "M:wg,bm,stages,split,flags;M:decode,SPLIT;…"] --json PATH
    python -m tools.probes.turboquant_hopper --compile   # sm_90a here, no GPU: registers, spills, hazards
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

import torch

from quantcore.backends.hopper_wgmma.launch import fit_stages, kernel_args, linear, prepare_x
from quantcore.backends.hopper_wgmma.layout import LookupWeights
from quantcore.backends.hopper_wgmma.plans import DecodePlan, Plan
from quantcore.backends.hopper_wgmma.turboquant_layout import passes_to_lookup
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.benchmarks.memory import rotation_sets
from quantcore.benchmarks.suites.turboquant_linear import format_bytes
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.turboquant import TurboQuant
from quantcore.kernels.turboquant.base import TurboQuantPrepared, rotate_input
from quantcore.kernels.turboquant.rotation import InputRotation
from quantcore.timing import time_interleaved

from .hopper_plan_times import parse_plan
from .turboquant_paths import _rel_error, _weights

D = 128
DTYPE = torch.bfloat16
#: Plans timed at each M (the 4-bit table's shapes of plan; ``decode,SPLIT``: the decode
#: kernel); ``--plans`` adds others.
PLANS = {
    1: ["decode,4", "decode,8", "1,8,8,2,in_flight", "1,8,8,4,in_flight"],
    8: ["decode,4", "decode,8", "1,8,8,4,in_flight"],
    16: ["decode,4", "1,16,8,2,in_flight", "2,16,4,1,in_flight,ws", "1,16,4,4,in_flight"],
    64: ["1,64,5,2,in_flight", "2,64,4,1,in_flight,ws", "1,64,4,1,in_flight,ws"],
    128: ["1,128,4,2,in_flight", "2,128,4,1,in_flight,ws", "1,128,4,1,in_flight,ws"],
    256: ["2,128,4,1,in_flight,ws", "2,256,3,1,in_flight,ws"],
    512: ["2,128,4,1,in_flight,ws", "2,256,3,1,in_flight,ws"],
    2048: ["2,128,4,1,in_flight,ws", "2,256,3,1,in_flight,ws"],
}
FAILURES: list[str] = []


def tq_to_hopper(prep: TurboQuantPrepared) -> LookupWeights:
    """The layer's passes as one 4-bit code matrix ``[N, P·K]`` in ``hopper_wgmma``'s layout
    into the layer's 16 float32 centroids (``turboquant_layout.passes_to_lookup``: group g of
    pass p at columns ``(g·P + p)·d``, its float32 scale row likewise)."""
    return passes_to_lookup(prep.passes, prep.codebook.to(torch.float32).contiguous(), D)


def rotated(x: torch.Tensor, prep: TurboQuantPrepared) -> torch.Tensor:
    """x rotated by every pass, interleaved as :func:`tq_to_hopper` lays the codes out: the
    ``[M, G, P, d]`` that ``turboquant_triton``'s own rotation GEMM writes (one GEMM for
    every pass; ``quantcore/kernels/turboquant/rotation.py``), kept with the layer."""
    # Layers made by dataclasses.replace share one cache: keyed by the rotations themselves.
    sources = tuple(data.rotation for data in prep.passes)
    kept = prep.cache.get(("hopper lookup rotation", x.dtype))
    if kept is None or any(a is not b for a, b in zip(kept[0], sources, strict=True)):
        kept = prep.cache[("hopper lookup rotation", x.dtype)] = (
            sources, InputRotation([r.to(x.dtype) for r in sources]))
    return kept[1](x.contiguous()).view(x.shape[0], -1)


def run(x_rot: torch.Tensor, w: LookupWeights, plan: Plan | DecodePlan) -> torch.Tensor:
    """The launch ``plan`` names (a decode plan of 16 rows past 8), over rotated rows."""
    if isinstance(plan, DecodePlan) and x_rot.shape[0] > plan.bm:
        plan = dataclasses.replace(plan, bm=16)
    return linear(x_rot, w, plan)


def plan_of_text(text: str) -> Plan | DecodePlan:
    """``decode,SPLIT`` or ``hopper_plan_times``' ``wg,bm,stages,split,flags``."""
    return DecodePlan(split=int(text.split(",")[1])) if text.startswith("decode") else parse_plan(text)


def _fail(where: str, problem: str) -> None:
    FAILURES.append(f"FAIL {where}: {problem}")
    print(FAILURES[-1], file=sys.stderr, flush=True)


def exact_layer(prep: TurboQuantPrepared, k: int, seed: int) -> tuple[TurboQuantPrepared, torch.Tensor]:
    """A layer whose every product and sum is exact in float32 (module docstring), and its x."""
    gen = torch.Generator().manual_seed(seed)
    dev = prep.codebook.device
    codebook = prep.codebook.clone()
    codebook[:16] = (torch.randperm(16, generator=gen).float() / 4 - 2).to(dev)
    passes = []
    for data in prep.passes:
        pi = torch.zeros(1, D, D)
        pi[0, torch.arange(D), torch.randperm(D, generator=gen)] = torch.randint(0, 2, (D,), generator=gen) * 2. - 1
        scales = 2.0 ** torch.randint(-3, 2, data.scales.shape, generator=gen).float()
        passes.append(dataclasses.replace(data, rotation=pi.to(dev, data.rotation.dtype), scales=scales.to(dev)))
    return dataclasses.replace(prep, codebook=codebook, passes=tuple(passes)), torch.randint(-8, 9, (3, k), generator=gen)


def golden_output(x: torch.Tensor, prep: TurboQuantPrepared) -> torch.Tensor:
    """x · Ŵᵀ in float64 from the prepared passes: Σ_p (x R_p) · (c[idx_p]·s_p)ᵀ."""
    out = 0
    for data in prep.passes:
        n = data.indices.shape[0]
        idx = torch.stack((data.indices & 15, data.indices >> 4), -1).reshape(n, -1).long()
        w = prep.codebook.double()[idx] * data.scales.double().repeat_interleave(D, 1)
        xr = rotate_input(x.double(), data.rotation.double())
        out = out + xr @ w.t()
    return out


def device_rows(k: int, n: int, m: int, residual: bool, plans: list[Plan | DecodePlan], rounds: int) -> list[dict[str, Any]]:
    dev = "cuda"
    fmt = TurboQuant(bits=4, group_size=D, residual=residual)
    sets = rotation_sets(format_bytes(fmt, m, k, n), dev)
    kernel = TurboQuantTriton(fmt, dev)
    prepared = [kernel.prepare(w, dtype=DTYPE) for w in _weights(fmt, k, n, sets, dev)]
    hopper = [tq_to_hopper(p) for p in prepared]
    xs = [torch.randn(m, k, device=dev, dtype=DTYPE) for _ in range(sets)]
    golden = golden_output(xs[0], prepared[0])
    shipped = kernel(xs[0], prepared[0])
    smem = torch.cuda.get_device_properties(dev).shared_memory_per_block_optin - 2048  # the static table
    exact_prep, exact_x = exact_layer(prepared[0], k, k + n + m)
    exact_w = tq_to_hopper(exact_prep)
    exact_x = exact_x[:m].to(dev, DTYPE) if m <= 3 else torch.randint(-8, 9, (m, k), device=dev).to(DTYPE)
    exact_want = golden_output(exact_x, exact_prep).to(DTYPE)
    base = {"K": k, "N": n, "M": m, "passes": len(prepared[0].passes)}
    rows, keep = [], {}
    for plan in plans:
        if isinstance(plan, Plan):
            plan = fit_stages(plan, hopper[0], smem)
        name = f"hopper lookup {plan}"
        try:
            y = run(rotated(xs[0], prepared[0]), hopper[0], plan)
            exact_y = run(rotated(exact_x, exact_prep), exact_w, plan)
            torch.cuda.synchronize()
        except Exception as exc:  # a plan that fails is a row, not the end of the probe
            rows.append({**base, "variant": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            _fail(f"K{k} N{n} M{m} {name}", rows[-1]["error"])
            continue
        verdict = compare(y, golden.to("cpu"), tolerance_for(DTYPE))
        problem = ("" if verdict.ok else f"against the float64 golden: {verdict.problem}") or \
                  ("" if torch.equal(exact_y, exact_want) else "exact inputs: not the golden's bits")
        err = _rel_error(y, golden)
        if problem:
            rows.append({**base, "variant": name, "rel_error": err, "error": f"wrong result: {problem}"})
            _fail(f"K{k} N{n} M{m} {name}", problem)
            continue
        keep[name] = (lambda i, pl=plan: run(rotated(xs[i % sets], prepared[i % sets]), hopper[i % sets], pl), sets,
                      {**base, "variant": name, "plan": dataclasses.asdict(plan), "rel_error": err,
                       "rel_diff_to_turboquant_triton": _rel_error(y, shipped.double())})
    keep["the rotation GEMM alone"] = (lambda i: rotated(xs[i % sets], prepared[i % sets]), sets,
                                       {**base, "variant": "the rotation GEMM alone"})
    dense = [torch.randn(n, k, device=dev, dtype=DTYPE) for _ in range(rotation_sets(2 * k * n, dev))]
    keep["turboquant_triton"] = (lambda i: kernel(xs[i % sets], prepared[i % sets]), sets,
                                 {**base, "variant": "turboquant_triton", "rel_error": _rel_error(shipped, golden)})
    keep["cuBLAS bf16"] = (lambda i: torch.nn.functional.linear(xs[i % sets], dense[i % len(dense)]), len(dense),
                           {**base, "variant": "cuBLAS bf16"})
    timings = time_interleaved([v[0] for v in keep.values()], dev, rounds=rounds, graph=True,
                               sets=[v[1] for v in keep.values()])
    by_name = dict(zip(keep, timings, strict=True))
    bf16, tq = by_name["cuBLAS bf16"].median_s, by_name["turboquant_triton"].median_s
    for name, t in by_name.items():
        rows.append({**keep[name][2], "us": t.median_s * 1e6, "spread": t.spread, "method": t.method,
                     "vs_bf16": bf16 / t.median_s, "vs_turboquant_triton": tq / t.median_s})
    return rows


def compile_lookup(text: str, m: int, dtype: torch.dtype) -> dict[str, Any]:
    """The ``LOOKUP`` kernel of plan ``text`` for ``m`` rows compiled for sm_90a here:
    registers, spill stack, shared memory, LDS and HGMMA counts, operand hazards."""
    from triton.runtime.jit import mangle_type

    from quantcore.backends.hopper_wgmma.kernels import wgmma_kernel
    from quantcore.triton.compile_report import compile_sm90

    from .hopper_wgmma_hazards import operand_hazards

    fmt = TurboQuant(bits=4, group_size=D)
    prep = TurboQuantTriton(fmt, "cpu").prepare(fmt.quantize(torch.randn(256, 512) * 0.02,
                                                             generator=torch.Generator().manual_seed(0)))
    w = tq_to_hopper(prep)
    x = prepare_x(torch.zeros(m, 512, dtype=dtype))
    y = torch.zeros(m, 256, dtype=dtype)
    _, args, const = kernel_args(x, w, parse_plan(text), y, torch.zeros(4), torch.zeros(4, dtype=torch.int32))
    options = {"num_warps": const.pop("num_warps")}
    names = [a for a in wgmma_kernel.arg_names if a not in const]
    signature = {name: mangle_type(a) for name, a in zip(names, args, strict=True)}
    c = compile_sm90(wgmma_kernel, signature, const, divisible=[], options=options, gluon=True)
    return {"plan": text, "dtype": str(dtype).removeprefix("torch."), "registers": c.registers,
            "spill_stack": c.spill_stack, "shared": c.shared, "lds": c.sass.count("LDS "),
            "hgmma": c.sass.count("HGMMA."), "hazards": len(operand_hazards(c.sass))}


def compile_report() -> list[dict[str, Any]]:
    """Every default plan's ``LOOKUP`` kernel compiled for sm_90a here, bf16 and fp16."""
    out = []
    for m, texts in PLANS.items():
        for text in (t for t in texts if not t.startswith("decode")):
            for dtype in (torch.bfloat16, torch.float16):
                out.append(compile_lookup(text, m, dtype))
                print(out[-1], flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,16,64,128")
    ap.add_argument("--shapes", default="4096x14336,14336x4096,4096x4096")
    ap.add_argument("--residual", action="store_true")
    ap.add_argument("--plans", default="", help="'M:wg,bm,stages,split,flags;…' or 'M:decode,SPLIT', tried first at M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    if args.compile:
        report = compile_report()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        return 0
    plans = {m: [plan_of_text(t) for t in texts] for m, texts in PLANS.items()}
    for item in filter(None, args.plans.split(";")):
        m, text = item.split(":")
        plans.setdefault(int(m), []).insert(0, plan_of_text(text))
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "rows": []}
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        for m in (int(v) for v in args.ms.split(",")):
            out["rows"] += device_rows(k, n, m, args.residual, plans[m], args.rounds)
            for r in out["rows"][-len(plans[m]) - 3:]:
                print(k, n, m, r["variant"], f"{r['us']:.1f}" if "us" in r else r.get("error"),
                      f"{r.get('vs_bf16', 0):.2f}x bf16 {r.get('vs_turboquant_triton', 0):.2f}x tq", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)
    out["failures"] = FAILURES
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"{len(FAILURES)} FAILURES" if FAILURES else "correctness: every plan passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    raise SystemExit(main())
