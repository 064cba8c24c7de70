"""trtllm_moe on a GPU, in one call: check every candidate tile of the Triton kernel against
a float32 reference and time it against bf16 per-expert cuBLAS, at the seed's shape
(E = 8, top-2, K = 4096, N = 28672, group 128, bf16) for T ∈ {1, 16, 64, 512, 4096}.

    python -m quantcore.backends.trtllm_moe.gpu_sweep --out DIR [--jobs 12] [--only T,T]
    python -m quantcore.backends.trtllm_moe.gpu_sweep --profile T     (one call, for ncu)

Method (the device README's METHOD.md): the copy ceiling measured in the same run
(device-to-device, bytes read + written); every time a median of CUDA-graph replays
(``triton.testing.do_bench_cudagraph``); random data, each weight set far larger than
L2. A tile whose output is off by more than bf16 rounding, or not fully written (the
output is poisoned with NaN first), is reported and not timed. Compilation runs first in
a process pool (Triton's on-disk cache is shared), so the sweep times instead of
compiling. Writes ``sweep.json`` into DIR and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from .tiles import MoETile, pick_tile

E, TOPK, K, N, GROUP = 8, 2, 4096, 28672, 128
TOKENS = (1, 16, 64, 512, 4096)


def candidates(t: int) -> list[MoETile]:
    """Tiles to try per T (top-2: routes per expert = T / 4)."""
    small = MoETile(16, 64, 128, 4, 4)
    if t == 1:
        return [small, replace(small, bn=32), replace(small, bn=128), replace(small, num_stages=6),
                replace(small, scale_pairs=False), replace(small, pre_scale=False)]
    if t == 16:
        return [small, replace(small, bn=128), replace(small, num_stages=6), replace(small, scale_pairs=False),
                replace(small, pre_scale=False)]
    if t == 64:
        mid = MoETile(32, 64, 128, 4, 4)
        return [mid, small, replace(mid, bn=128), replace(mid, scale_pairs=False),
                MoETile(32, 128, 128, 4, 4, scheduled=True)]
    big = MoETile(128, 128, 64, 8, 4, scheduled=True)
    if t == 512:
        return [big, replace(big, bk=128), replace(big, num_warps=4, bm=64, bk=128), replace(big, bm=256),
                replace(big, x_sorted=True), replace(big, persistent=0), replace(big, scale_pairs=False),
                replace(big, num_stages=3)]
    huge = MoETile(256, 128, 64, 8, 4, scheduled=True)
    return [huge, replace(huge, num_stages=3), big, replace(big, bk=128), replace(huge, x_sorted=True),
            replace(huge, persistent=0), replace(huge, scale_pairs=False)]


def _routing(t: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.rand(t, E, generator=gen, device="cuda").argsort(dim=1)[:, :TOPK].to(torch.int32)


def _weights(sym: bool, dtype: torch.dtype, group: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    g = K // group
    out = {
        "qweight": torch.randint(-128, 128, (E, K, N), dtype=torch.int8, device="cuda", generator=gen),
        "scales": (torch.rand(E, g, N, device="cuda", generator=gen) * 2e-4 + 1e-4).to(dtype),
    }
    if not sym:
        out["zeros"] = (torch.randn(E, g, N, device="cuda", generator=gen) * 1e-3).to(dtype)
    return out


_WORKER: dict[Any, Any] = {}


def _compile_task(task: tuple[int, MoETile, bool, bool, str, int]) -> str:
    """Run one (T, tile, gated, sym, dtype, group) call in a worker: fills the cache."""
    from quantcore.formats.trtllm_moe import TRTLLMMoE

    from .triton_kernel import TritonMoE, TritonMoEWeights

    t, tile, gated, sym, dname, group = task
    dtype = getattr(torch, dname)
    key = (sym, dname, group)
    try:
        if key not in _WORKER:
            w = _weights(sym, dtype, group)
            _WORKER[key] = TritonMoEWeights(w["qweight"], w["scales"], w.get("zeros"), group)
        kernel = TritonMoE(TRTLLMMoE(group_size=group, sym=sym, scale_dtype=dtype), "cuda")
        x = torch.randn(t, K, device="cuda").to(dtype)
        kernel.forward(x, _routing(t, 1), _WORKER[key], tile=tile, gated=gated)
        torch.cuda.synchronize()
        return ""
    except Exception as exc:  # reported by the main process, which tries again
        return f"{task}: {type(exc).__name__}: {str(exc)[:200]}"


def precompile(tasks: list[tuple[int, MoETile, bool, bool, str, int]], jobs: int) -> list[str]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(jobs) as pool:
        return [err for err in pool.map(_compile_task, tasks, chunksize=1) if err]


def bench(fn: Any) -> float:
    import triton.testing as tt

    return float(tt.do_bench_cudagraph(fn, rep=150, return_mode="median"))


def copy_bandwidth() -> float:
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    import triton.testing as tt

    ms = float(tt.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median"))
    return 2 * (2 << 30) / (ms * 1e-3)


def reference(x: torch.Tensor, ids: torch.Tensor, w: dict[str, torch.Tensor], group: int) -> torch.Tensor:
    rows = x.float().repeat_interleave(TOPK, dim=0)
    flat = ids.reshape(-1)
    out = torch.empty(rows.shape[0], N, device=x.device)
    for e in torch.unique(flat).tolist():
        sel = flat == e
        dense = w["qweight"][e].float() * w["scales"][e].float().repeat_interleave(group, dim=0)
        if "zeros" in w:
            dense += w["zeros"][e].float().repeat_interleave(group, dim=0)
        out[sel] = rows[sel] @ dense
        del dense
    return out.view(x.shape[0], TOPK, N)


def bf16_peer(x: torch.Tensor, ids: torch.Tensor, dense: torch.Tensor) -> Any:
    """One cuBLAS matmul per touched expert over tokens pre-sorted by expert."""
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    xs = x.repeat_interleave(TOPK, dim=0)[order].contiguous()
    counts = torch.bincount(flat, minlength=E).tolist()
    ys = torch.empty(xs.shape[0], N, dtype=x.dtype, device=x.device)
    segments, start = [], 0
    for e, c in enumerate(counts):
        if c:
            segments.append((e, start, start + c))
            start += c

    def run() -> None:
        for e, a, b in segments:
            torch.mm(xs[a:b], dense[e].t(), out=ys[a:b])

    return run


def sweep(out_dir: Path, only: tuple[int, ...], jobs: int) -> dict[str, Any]:
    from quantcore.formats.trtllm_moe import TRTLLMMoE
    from quantcore.ops.moe import swiglu

    from .triton_kernel import TritonMoE

    t_start = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    fmt = TRTLLMMoE(group_size=GROUP, sym=True, scale_dtype=torch.bfloat16)
    extras = [(512, True, True, "bfloat16", GROUP), (4096, True, True, "bfloat16", GROUP),
              (16, False, False, "bfloat16", GROUP), (4096, False, False, "bfloat16", GROUP),
              (16, False, True, "float16", 64), (4096, False, True, "float16", 64)]
    tasks = [(t, tile, False, True, "bfloat16", GROUP) for t in only for tile in candidates(t)]
    for t, gated, sym, dname, group in extras:
        if t in only:
            tile = pick_tile(t * TOPK, E, K, group, device_name=props.name)
            tasks.append((t, tile, gated, sym, dname, group))
    errors = precompile(tasks, jobs)
    compile_s = time.perf_counter() - t_start
    print(f"precompiled {len(tasks)} kernels in {compile_s:.0f} s ({len(errors)} errors)", flush=True)
    for err in errors:
        print("  compile:", err, flush=True)

    copy_bw = copy_bandwidth()
    print(f"{props.name}: copy {copy_bw / 1e12:.2f} TB/s (read + written)", flush=True)
    w = _weights(True, torch.bfloat16, GROUP)
    kernel = TritonMoE(fmt, "cuda")
    t0 = time.perf_counter()
    prepared = kernel.prepare(w, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    prep_s = time.perf_counter() - t0
    gen = torch.Generator(device="cuda").manual_seed(7)
    dense = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02

    rows: list[dict[str, Any]] = []
    kept: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}
    for t in only:
        x = torch.randn(t, K, device="cuda", generator=gen).to(torch.bfloat16)
        ids = _routing(t, 1)
        touched = int(torch.unique(ids).numel())
        peer_ms = bench(bf16_peer(x, ids, dense))
        ref = reference(x, ids, w, GROUP)
        w8_bytes = touched * (K * N + (K // GROUP) * N * 2) + x.numel() * 2 + t * TOPK * N * 2
        default = pick_tile(t * TOPK, E, K, GROUP, device_name=props.name)
        tried = []
        for tile in [default, *[c for c in candidates(t) if c != default]]:
            entry: dict[str, Any] = {"tile": tile.describe(), "spec": asdict(tile), "default": tile == default}
            try:
                # Poison: the caching allocator hands this block to the output next.
                torch.full((t * TOPK, N), float("nan"), dtype=torch.bfloat16, device="cuda")
                y = kernel.forward(x, ids, prepared, tile=tile).float()
                rel = float((y - ref).norm() / ref.norm())
                entry["rel_err"] = rel
                if not rel < 4e-3:  # NaN fails too
                    entry["error"] = f"wrong: rel err {rel:.2e}"
                else:
                    entry["ms"] = bench(lambda x=x, ids=ids, tile=tile: kernel.forward(x, ids, prepared, tile=tile))
            except Exception as exc:  # a tile that does not compile or launch is reported, not fatal
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            tried.append(entry)
            line = f"{entry['ms']:.4f} ms" if "ms" in entry else entry["error"]
            print(f"  T={t} {tile.describe()}: {line}", flush=True)
        timed = [r for r in tried if "ms" in r]
        best = min(timed, key=lambda r: r["ms"]) if timed else None
        row: dict[str, Any] = {
            "T": t, "experts_touched": touched, "bf16_ms": peer_ms, "w8_bytes": w8_bytes,
            "bf16_bytes": touched * K * N * 2 + x.numel() * 2 + t * TOPK * N * 2, "flops": 2.0 * t * TOPK * K * N,
            "tiles": tried,
        }
        if best is not None:
            row |= {"best": best["tile"], "best_ms": best["ms"], "speedup": peer_ms / best["ms"],
                    "copy_share": w8_bytes / (best["ms"] * 1e-3) / copy_bw}
        rows.append(row)
        kept[t] = (x, ids, peer_ms)
        del ref

    extra_rows = []
    for t, gated, sym, dname, group in extras:
        if t not in kept:
            continue
        x, ids, peer_ms = kept[t]
        dtype = getattr(torch, dname)
        xe = x.to(dtype)
        if gated:
            k_g, prep_g = kernel, prepared
        else:
            wg = _weights(sym, dtype, group, seed=3)
            fmt_g = TRTLLMMoE(group_size=group, sym=sym, scale_dtype=dtype)
            k_g = TritonMoE(fmt_g, "cuda")
            prep_g = k_g.prepare(wg, dtype=dtype)
        entry: dict[str, Any] = {"T": t, "gated": gated, "sym": sym, "dtype": dname, "group": group}
        try:
            if gated:
                a = k_g.gated(xe, ids, prep_g).float()
                ref_a = swiglu(reference(xe, ids, w, group))
                entry["rel_err"] = float((a - ref_a).norm() / ref_a.norm())
                entry["fused_ms"] = bench(lambda xe=xe, ids=ids: k_g.forward(xe, ids, prep_g, gated=True))
                entry["unfused_ms"] = bench(
                    lambda xe=xe, ids=ids: swiglu(k_g.forward(xe, ids, prep_g).float()).to(dtype))
            else:
                y = k_g.forward(xe, ids, prep_g).float()
                ref_y = reference(xe, ids, wg, group)
                entry["rel_err"] = float((y - ref_y).norm() / ref_y.norm())
                entry["ms"] = bench(lambda xe=xe, ids=ids: k_g.forward(xe, ids, prep_g))
                entry["bf16_ms"] = peer_ms
                del wg, prep_g
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        extra_rows.append(entry)
        print(f"  extra {entry}", flush=True)

    result = {
        "device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
        "triton": __import__("triton").__version__, "copy_bytes_per_s": copy_bw, "prepare_s": prep_s,
        "compile_s": compile_s, "shape": {"E": E, "topk": TOPK, "K": K, "N": N, "group_size": GROUP, "act": "bf16"},
        "rows": rows, "extras": extra_rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sweep.json").write_text(json.dumps(result, indent=1))
    print(f"\n{props.name}, copy {copy_bw / 1e12:.2f} TB/s; CUDA-graph medians; best tile per T")
    print("| T | bf16 ms | w8a16 ms | speed-up | share of copy | best tile |")
    for r in rows:
        if "best" in r:
            print(f"| {r['T']} | {r['bf16_ms']:.4f} | {r['best_ms']:.4f} | {r['speedup']:.2f}x | "
                  f"{r['copy_share']:.0%} | {r['best']} |")
    return result


def profile(t: int, tile_spec: str | None) -> None:
    """A few calls of the default (or given) tile at T, for ncu."""
    from quantcore.formats.trtllm_moe import TRTLLMMoE

    from .triton_kernel import TritonMoE

    fmt = TRTLLMMoE(group_size=GROUP, sym=True, scale_dtype=torch.bfloat16)
    kernel = TritonMoE(fmt, "cuda")
    prepared = kernel.prepare(_weights(True, torch.bfloat16, GROUP), dtype=torch.bfloat16)
    x = torch.randn(t, K, device="cuda").to(torch.bfloat16)
    ids = _routing(t, 1)
    tile = MoETile(**json.loads(tile_spec)) if tile_spec else None
    for _ in range(3):
        kernel.forward(x, ids, prepared, tile=tile)
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    ap.add_argument("--only", default=",".join(map(str, TOKENS)), help="comma-separated T values")
    ap.add_argument("--jobs", type=int, default=12, help="compile processes")
    ap.add_argument("--profile", type=int, default=None, help="just run T a few times (for ncu)")
    ap.add_argument("--tile", default=None, help="with --profile: a MoETile as JSON")
    args = ap.parse_args()
    if args.profile is not None:
        profile(args.profile, args.tile)
        return
    sweep(args.out, tuple(int(v) for v in args.only.split(",")), args.jobs)


if __name__ == "__main__":
    main()
