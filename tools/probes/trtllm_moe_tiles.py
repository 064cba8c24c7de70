"""trtllm_moe on a GPU, in one call: check every candidate tile of the Triton kernel against
a float32 reference and time it against bf16 per-expert cuBLAS, at the format's reference shape
(E = 8, top-2, K = 4096, N = 28672, group 128, bf16) for T ∈ {1, 16, 64, 512, 4096}.

    python -m tools.probes.trtllm_moe_tiles --out DIR [--jobs 12] [--only T,T]
    python -m tools.probes.trtllm_moe_tiles --profile T     (one call, for ncu)

Method: the copy ceiling measured in the same run
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

from quantcore.backends.trtllm_moe.tiles import MoETile, pick_tile
from quantcore.probe.card import card_key

E, TOPK, K, N, GROUP = 8, 2, 4096, 28672, 128
TOKENS = (1, 16, 64, 512, 4096)


#: T → the largest routes per expert its best tile serves in the tuned table.
LIMITS = {1: 1, 16: 8, 64: 24, 512: 192, 4096: 1 << 62}


def candidates(t: int) -> list[MoETile]:
    """Tiles to try per T (top-2: routes per expert = T / 4); the shipped one is added."""
    if t == 1:
        small = MoETile(16, 64, 128, 4, 4, pre_scale=False)
        return [small, replace(small, pre_scale=True), replace(small, bn=128)]
    if t == 16:
        small = MoETile(16, 64, 128, 4, 4)
        return [small, replace(small, bn=128)]
    if t == 64:
        mid = MoETile(32, 128, 128, 4, 4)
        return [mid, replace(mid, pre_scale=False)]
    wide = MoETile(256, 128, 64, 8, 4, scheduled=True, persistent=0, split_tail=True)
    narrow = MoETile(128, 128, 128, 8, 4, scheduled=True, persistent=0, split_tail=True)
    persistent = MoETile(256, 128, 64, 8, 4, scheduled=True)
    if t == 512:
        return [wide, persistent, replace(wide, num_stages=3), narrow, replace(narrow, split_tail=False, persistent=1)]
    return [wide, persistent, replace(wide, num_stages=5), replace(persistent, num_stages=5),
            replace(wide, bk=128, num_stages=2)]


#: Correctness only, at T = 4096: (dtype, group) × tiles, for the wide-tile question. With
#: fp16 scales on sm_90 the kernel refuses pre-scaled tiles (backends/trtllm_moe/README.md):
#: those rows record the refusal, the post-scaled ones the answer.
_WIDE = (MoETile(256, 128, 64, 8, 4, scheduled=True, persistent=0, split_tail=True),
         MoETile(256, 128, 64, 8, 4, scheduled=True, scale_pairs=False),
         MoETile(128, 128, 64, 8, 4, scheduled=True, persistent=0, split_tail=True))
MATRIX = [
    (dname, group, variant)
    for dname, group in (("float16", 64), ("bfloat16", 64), ("float16", 128))
    for tile in _WIDE
    if not (group == 128 and tile.bm == 128)
    for variant in ((tile, replace(tile, pre_scale=False)) if dname == "float16" else (tile,))
]


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
    from quantcore.backends.trtllm_moe.triton_kernel import TritonMoE, TritonMoEWeights
    from quantcore.formats.trtllm_moe import TRTLLMMoE

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


def _wait_for(pid: int | None, limit_s: float) -> None:
    """Hold the timing until another process (the CUDA tests run beside the compile
    phase) has ended, so nothing else uses the GPU while kernels are timed."""
    if not pid:
        return
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(1.0)
    print(f"process {pid} still running after {limit_s:.0f} s: timing anyway", flush=True)


def _check(kernel: Any, prepared: Any, x: torch.Tensor, ids: torch.Tensor, ref: torch.Tensor,
           tile: MoETile | None, gated: bool = False) -> float:
    # Poison: the caching allocator hands this block to the output next.
    torch.full((x.shape[0] * TOPK, N // 2 if gated else N), float("nan"), dtype=x.dtype, device="cuda")
    y = kernel.forward(x, ids, prepared, tile=tile, gated=gated).float()
    return float((y - ref).norm() / ref.norm())


def sweep(out_dir: Path, only: tuple[int, ...], jobs: int, wait_pid: int | None) -> dict[str, Any]:
    from quantcore.backends.trtllm_moe.triton_kernel import TritonMoE
    from quantcore.formats.trtllm_moe import TRTLLMMoE
    from quantcore.ops.moe import swiglu

    t_start = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    card = card_key(0)
    fmt = TRTLLMMoE(group_size=GROUP, sym=True, scale_dtype=torch.bfloat16)
    shipped = {t: pick_tile(t * TOPK, E, K, GROUP, scale_dtype=torch.bfloat16, card=card) for t in only}
    tried = {t: [shipped[t], *[c for c in candidates(t) if c != shipped[t]]] for t in only}
    extras = [(t, gated, sym, dname, group) for t, gated, sym, dname, group in (
        (512, True, True, "bfloat16", GROUP), (4096, True, True, "bfloat16", GROUP),
        (16, False, False, "bfloat16", GROUP), (4096, False, False, "bfloat16", GROUP),
        (16, False, True, "float16", 64), (512, False, True, "float16", 64)) if t in only]
    extra_tile = {(t, dname, group): pick_tile(t * TOPK, E, K, group, scale_dtype=getattr(torch, dname),
                                               card=card) for t, _, _, dname, group in extras}
    tasks = [(t, tile, False, True, "bfloat16", GROUP) for t in only for tile in tried[t]]
    tasks += [(t, extra_tile[t, d, g], gated, sym, d, g) for t, gated, sym, d, g in extras]
    if 4096 in only:
        tasks += [(4096, tile, False, True, d, g) for d, g, tile in MATRIX]
    errors = precompile(tasks, jobs)
    compile_s = time.perf_counter() - t_start
    print(f"precompiled {len(tasks)} kernels in {compile_s:.0f} s ({len(errors)} errors)", flush=True)
    for err in errors:
        print("  compile:", err, flush=True)
    _wait_for(wait_pid, 240.0)
    print(f"timing from {time.perf_counter() - t_start:.0f} s", flush=True)

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
        entries = []
        for tile in tried[t]:
            entry: dict[str, Any] = {"tile": tile.describe(), "spec": asdict(tile), "shipped": tile == shipped[t]}
            try:
                entry["rel_err"] = rel = _check(kernel, prepared, x, ids, ref, tile)
                if not rel < 4e-3:  # NaN fails too
                    entry["error"] = f"wrong: rel err {rel:.2e}"
                else:
                    entry["ms"] = bench(lambda x=x, ids=ids, tile=tile: kernel.forward(x, ids, prepared, tile=tile))
            except Exception as exc:  # a tile that does not compile or launch is reported, not fatal
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            entries.append(entry)
            line = f"{entry['ms']:.4f} ms" if "ms" in entry else entry["error"]
            print(f"  T={t} {tile.describe()}: {line}", flush=True)
        timed = [r for r in entries if "ms" in r]
        best = min(timed, key=lambda r: r["ms"]) if timed else None
        row: dict[str, Any] = {
            "T": t, "experts_touched": touched, "bf16_ms": peer_ms, "w8_bytes": w8_bytes,
            "bf16_bytes": touched * K * N * 2 + x.numel() * 2 + t * TOPK * N * 2, "flops": 2.0 * t * TOPK * K * N,
            "tiles": entries,
        }
        if best is not None:
            row |= {"best": best["tile"], "best_spec": best["spec"], "best_ms": best["ms"],
                    "speedup": peer_ms / best["ms"], "copy_share": w8_bytes / (best["ms"] * 1e-3) / copy_bw}
        rows.append(row)
        kept[t] = (x, ids, peer_ms)
        del ref

    # The tuned table: each T's fastest correct tile serves the routes per expert up to
    # the next T's. Written before the extras, which read nothing from it.
    table = [[LIMITS[r["T"]], r["best_spec"]] for r in rows if "best_spec" in r]
    (out_dir / "tiles.json").write_text(json.dumps({"device": props.name, "table": table}, indent=1))

    extra_rows = []
    for t, gated, sym, dname, group in extras:
        x, ids, peer_ms = kept[t]
        dtype = getattr(torch, dname)
        xe = x.to(dtype)
        tile = extra_tile[t, dname, group]
        entry: dict[str, Any] = {"T": t, "gated": gated, "sym": sym, "dtype": dname, "group": group,
                                 "tile": tile.describe(), "bf16_ms": peer_ms}
        try:
            if gated:
                ref_a = swiglu(reference(xe, ids, w, group))
                entry["rel_err"] = _check(kernel, prepared, xe, ids, ref_a, tile, gated=True)
                entry["fused_ms"] = bench(
                    lambda xe=xe, ids=ids, tile=tile: kernel.forward(xe, ids, prepared, gated=True, tile=tile))
                entry["unfused_ms"] = bench(lambda xe=xe, ids=ids, tile=tile, dtype=dtype: swiglu(
                    kernel.forward(xe, ids, prepared, tile=tile).float()).to(dtype))
            else:
                wg = _weights(sym, dtype, group, seed=3)
                k_g = TritonMoE(TRTLLMMoE(group_size=group, sym=sym, scale_dtype=dtype), "cuda")
                prep_g = k_g.prepare(wg, dtype=dtype)
                entry["rel_err"] = _check(k_g, prep_g, xe, ids, reference(xe, ids, wg, group), tile)
                entry["ms"] = bench(lambda xe=xe, ids=ids, k_g=k_g, prep_g=prep_g, tile=tile: k_g.forward(
                    xe, ids, prep_g, tile=tile))
                del wg, prep_g
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        extra_rows.append(entry)
        print(f"  extra {entry}", flush=True)

    matrix_rows = []
    if 4096 in kept:
        x, ids, _ = kept[4096]
        for dname, group in dict.fromkeys((d, g) for d, g, _ in MATRIX):
            dtype = getattr(torch, dname)
            wg = _weights(True, dtype, group, seed=5)
            k_g = TritonMoE(TRTLLMMoE(group_size=group, sym=True, scale_dtype=dtype), "cuda")
            prep_g = k_g.prepare(wg, dtype=dtype)
            xe = x.to(dtype)
            ref = reference(xe, ids, wg, group)
            for d2, g2, tile in MATRIX:
                if (d2, g2) != (dname, group):
                    continue
                entry = {"dtype": dname, "group": group, "tile": tile.describe()}
                try:
                    entry["rel_err"] = _check(k_g, prep_g, xe, ids, ref, tile)
                except Exception as exc:
                    entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                matrix_rows.append(entry)
                print(f"  T=4096 {dname} g{group} {tile.describe()}: rel err {entry.get('rel_err')}", flush=True)
            del wg, prep_g, ref

    result = {
        "device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
        "triton": __import__("triton").__version__, "copy_bytes_per_s": copy_bw, "prepare_s": prep_s,
        "compile_s": compile_s, "shape": {"E": E, "topk": TOPK, "K": K, "N": N, "group_size": GROUP, "act": "bf16"},
        "rows": rows, "extras": extra_rows, "wide_tile_matrix": matrix_rows, "tuned_table": table,
    }
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
    from quantcore.backends.trtllm_moe.triton_kernel import TritonMoE
    from quantcore.formats.trtllm_moe import TRTLLMMoE

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
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--only", default=",".join(map(str, TOKENS)), help="comma-separated T values")
    ap.add_argument("--jobs", type=int, default=12, help="compile processes")
    ap.add_argument("--profile", type=int, default=None, help="just run T a few times (for ncu)")
    ap.add_argument("--tile", default=None, help="with --profile: a MoETile as JSON")
    ap.add_argument("--wait-pid", type=int, default=None, help="compile, then wait for this process before timing")
    args = ap.parse_args()
    if args.profile is not None:
        profile(args.profile, args.tile)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    sweep(args.out, tuple(int(v) for v in args.only.split(",")), args.jobs, args.wait_pid)


if __name__ == "__main__":
    main()
