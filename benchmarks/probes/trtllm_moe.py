"""trtllm_moe on a GPU: the Triton W8A16 grouped GEMM against a bf16 MoE GEMM of
per-expert cuBLAS calls, in the same run, at the seed's shape.

    python -m quantcore.benchmarks.probes.trtllm_moe --out DIR [--sweep] [--quick]

GEMM1 of an E = 8, top-2 MoE, K = 4096, N = 28672 (2 × inter), bf16 activations, for
T ∈ {1, 16, 64, 512, 4096}. Method (device README, METHOD.md): bytes and flops counted
first; the copy ceiling measured in the same run (device-to-device, read + written);
medians of ``triton.testing.do_bench``, eager and as CUDA-graph replays; random data;
each weight set is far larger than the 50 MB L2, so no buffer rotation is needed for
them, and activations are drawn afresh per T.

Peers, timed the same way:

- ``bf16``: weights ``[E, N, K]`` bf16, tokens pre-sorted by expert (sorting not
  timed), one ``torch.mm`` per touched expert into its slice of the output.
- ``w8a16``: ``TritonMoE.forward`` — everything a call does except validating the
  ids (one host sync): the activation permutation, the route sort for T > 16, the
  kernel. ``kernel`` is the Triton launch alone on pre-sorted routes.

"Touched bytes" is what a call must read at least: the touched experts' weights (and
scales), the activations, plus the output written. Share of copy = touched bytes /
time / copy bandwidth. Writes ``trtllm_moe-<device>.md`` and ``.json`` into DIR.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

E, TOPK, K, N = 8, 2, 4096, 28672
TOKENS = (1, 16, 64, 512, 4096)


@dataclass
class Row:
    T: int
    experts_touched: int
    bf16_ms: float
    bf16_graph_ms: float
    w8_ms: float
    w8_graph_ms: float
    kernel_ms: float
    tile: str
    w8_bytes: int
    bf16_bytes: int
    flops: float
    rel_err: float

    def speedup(self) -> float:
        return self.bf16_graph_ms / self.w8_graph_ms


def bench(fn: Callable[[], Any], graph: bool) -> float:
    import triton.testing as tt

    if graph:
        return float(tt.do_bench_cudagraph(fn, rep=200, return_mode="median"))
    return float(tt.do_bench(fn, warmup=25, rep=200, return_mode="median"))


def copy_bandwidth() -> float:
    """Bytes read + written per second of a 2 GiB device-to-device copy."""
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), graph=False)
    return 2 * (2 << 30) / (ms * 1e-3)


def routing(t: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.rand(t, E, generator=gen, device="cuda").argsort(dim=1)[:, :TOPK].to(torch.int32)
    weights = torch.softmax(torch.randn(t, TOPK, generator=gen, device="cuda"), dim=-1)
    return ids, weights


def bf16_peer(x: torch.Tensor, ids: torch.Tensor, w_dense: torch.Tensor) -> tuple[Callable[[], None], torch.Tensor]:
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
            torch.mm(xs[a:b], w_dense[e].t(), out=ys[a:b])

    return run, ys


def tile_candidates(t: int, group: int) -> list[Any]:
    from quantcore.backends.trtllm_moe.triton_kernel import MoETile

    bk = min(128, group)
    r = t * TOPK
    if r <= 32:
        bm = max(16, 1 << (r - 1).bit_length())
        return [MoETile(bm, bn, b, w, st, dense=True, magic=m)
                for bn, b, w, st, m in ((32, bk, 4, 4, True), (64, bk, 4, 4, True), (64, bk, 4, 6, True),
                                        (128, bk, 4, 4, True), (64, 64, 4, 6, True), (64, bk, 4, 4, False))]
    per = r / E
    if per <= 24:
        return [MoETile(bm, bn, b, w, st, pre_scale=p)
                for bm in (16, 32) for bn, b, w, st, p in ((128, 64, 8, 4, False), (64, bk, 4, 4, False),
                                                          (128, 64, 8, 4, True))]
    if per <= 256:
        return [MoETile(bm, bn, 64, w, st, pre_scale=p)
                for bm, bn, w, st, p in ((64, 128, 8, 4, True), (128, 128, 8, 4, True), (128, 128, 8, 4, False),
                                         (128, 256, 8, 3, True), (256, 128, 8, 3, True))]
    return [MoETile(bm, bn, 64, w, st, pre_scale=p)
            for bm, bn, w, st, p in ((256, 128, 8, 3, True), (128, 128, 8, 4, True), (256, 128, 8, 4, True),
                                     (128, 256, 8, 3, True), (256, 64, 4, 3, True), (128, 128, 8, 4, False))]


def run(out_dir: Path, sweep: bool, quick: bool) -> dict[str, Any]:
    from quantcore.backends.trtllm_moe.routing import align_routes
    from quantcore.backends.trtllm_moe.triton_kernel import TritonMoE, pick_tile
    from quantcore.formats.trtllm_moe import TRTLLMMoE

    torch.manual_seed(0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    device_name = props.name
    copy_bw = copy_bandwidth()
    print(f"{device_name}: copy {copy_bw / 1e12:.2f} TB/s (read + written)", flush=True)

    group = 128
    fmt = TRTLLMMoE(group_size=group, sym=True, scale_dtype=torch.bfloat16)
    q = torch.randint(-128, 128, (E, K, N), dtype=torch.int8, device="cuda", generator=gen)
    scales = (torch.rand(E, K // group, N, device="cuda", generator=gen) * 2e-4 + 1e-4).to(torch.bfloat16)
    kernel = TritonMoE(fmt, "cuda")
    t0 = time.perf_counter()
    prepared = kernel.prepare({"qweight": q, "scales": scales}, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    prep_s = time.perf_counter() - t0
    w_dense = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02

    rows: list[Row] = []
    kept: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}
    sweeps: dict[int, list[tuple[str, float]]] = {}
    for t in TOKENS[:2] if quick else TOKENS:
        x = torch.randn(t, K, device="cuda", dtype=torch.bfloat16, generator=gen)
        ids, _ = routing(t, gen)
        touched = int(torch.unique(ids).numel())
        peer, _ = bf16_peer(x, ids, w_dense)
        bf16_ms, bf16_g = bench(peer, False), bench(peer, True)

        default = pick_tile(t * TOPK, E, N, group)
        tiles = tile_candidates(t, group) if sweep else []
        # Correctness on this very shape, for every tile: against the touched experts
        # dequantized in fp32; a tile off by more than bf16 rounding is not timed.
        ref = reference(x, ids, q, scales, group)
        results = []
        for tile in [default, *[c for c in tiles if c != default]]:
            try:
                y = kernel.forward(x, ids, prepared, tile=tile).float()
                rel = float((y - ref).norm() / ref.norm())
                if not rel < 4e-3:
                    print(f"  T={t} {tile}: WRONG, rel err {rel:.2e}", flush=True)
                    continue
                ms = bench(lambda x=x, ids=ids, tile=tile: kernel.forward(x, ids, prepared, tile=tile), True)
            except Exception as exc:  # a tile that does not compile is reported, not fatal
                print(f"  T={t} {tile}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            results.append((tile, ms, rel))
            print(f"  T={t} {ms:.4f} ms rel {rel:.1e} {tile}", flush=True)
        sweeps[t] = [(str(tl), ms, rel) for tl, ms, rel in results]
        if not results:
            print(f"T={t}: no tile ran correctly", flush=True)
            continue
        best_tile, w8_g, rel = min(results, key=lambda r: r[1])
        fwd = lambda x=x, ids=ids, tile=best_tile: kernel.forward(x, ids, prepared, tile=tile)  # noqa: E731
        w8_ms = bench(fwd, False)

        # The kernel alone: routes pre-sorted, activations pre-permuted.
        kernel_ms = bench_kernel_only(kernel, prepared, x, ids, best_tile, align_routes)

        w8_bytes = touched * (K * N + (K // group) * N * 2) + x.numel() * 2 + t * TOPK * N * 2
        bf16_bytes = touched * K * N * 2 + x.numel() * 2 + t * TOPK * N * 2
        row = Row(t, touched, bf16_ms, bf16_g, w8_ms, w8_g, kernel_ms, str(best_tile),
                  w8_bytes, bf16_bytes, 2.0 * t * TOPK * K * N, rel)
        rows.append(row)
        print(f"T={t:5d} touched={touched} bf16 {bf16_g:.4f} ms  w8a16 {w8_g:.4f} ms "
              f"(kernel {kernel_ms:.4f})  {row.speedup():.2f}x  "
              f"{w8_bytes / (w8_g * 1e-3) / copy_bw:.0%} of copy  rel {rel:.1e}  {best_tile}", flush=True)
        del peer
        kept[t] = (x, ids, bf16_g)

    # Asymmetric (zeros) with the default tiles, against the same bf16 times.
    asym_rows = []
    fmt_a = TRTLLMMoE(group_size=group, sym=False, scale_dtype=torch.bfloat16)
    zeros = (torch.randn(E, K // group, N, device="cuda", generator=gen) * 1e-3).to(torch.bfloat16)
    kernel_a = TritonMoE(fmt_a, "cuda")
    prepared_a = kernel_a.prepare({"qweight": q, "scales": scales, "zeros": zeros}, dtype=torch.bfloat16)
    for t in (1, 16, 4096):
        if t not in kept:
            continue
        x, ids, bf16_g = kept[t]
        y = kernel_a.forward(x, ids, prepared_a).float()
        ref = reference(x, ids, q, scales, group, zeros)
        rel = float((y - ref).norm() / ref.norm())
        ms = bench(lambda x=x, ids=ids: kernel_a.forward(x, ids, prepared_a), True)
        asym_rows.append({"T": t, "w8_graph_ms": ms, "bf16_graph_ms": bf16_g, "rel_err": rel,
                          "tile": str(pick_tile(t * TOPK, E, N, group, sym=False))})
        print(f"asym T={t}: {ms:.4f} ms, {bf16_g / ms:.2f}x bf16, rel {rel:.1e}", flush=True)

    result = {
        "device": device_name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "copy_bytes_per_s": copy_bw,
        "prepare_s": prep_s,
        "shape": {"E": E, "topk": TOPK, "K": K, "N": N, "group_size": group, "act": "bf16", "sym": True},
        "rows": [asdict(r) for r in rows],
        "sweeps": sweeps,
        "asym": asym_rows,
    }
    write(out_dir, result, rows, copy_bw)
    return result


def bench_kernel_only(kernel: Any, prepared: Any, x: torch.Tensor, ids: torch.Tensor, tile: Any,
                      align_routes: Any) -> float:
    from quantcore.backends.trtllm_moe.triton_source import moe_w8a16_kernel

    t, topk = ids.shape
    routes = t * topk
    x_perm = x.index_select(1, prepared.k_order)
    route_ids = ids.reshape(-1).to(torch.int32)
    if tile.dense:
        grid_r, srt, blk = E, route_ids, route_ids
    else:
        al = align_routes(route_ids, E, tile.bm)
        grid_r, srt, blk = al.num_blocks, al.sorted_routes, al.block_expert
    y = torch.empty(routes, N, dtype=x.dtype, device=x.device)

    def launch() -> None:
        moe_w8a16_kernel[(grid_r, -(-N // tile.bn))](
            x_perm, x_perm.stride(0), prepared.layout, prepared.scales, prepared.scales,
            route_ids, srt, blk, x_perm, y, y.stride(0),
            routes, N, prepared.scales.shape[1], topk,
            K=K, GROUP=prepared.group_size, BM=tile.bm, BN=tile.bn, BK=tile.bk,
            SYM=True, DENSE=tile.dense, HAS_RW=False, FP32_DOT=False,
            PRE_SCALE=tile.pre_scale, MAGIC=tile.magic,
            num_warps=tile.num_warps, num_stages=tile.num_stages,
        )

    return bench(launch, True)


def reference(x: torch.Tensor, ids: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group: int,
              zeros: torch.Tensor | None = None) -> torch.Tensor:
    t, topk = ids.shape
    rows = x.float().repeat_interleave(topk, dim=0)
    flat = ids.reshape(-1)
    out = torch.empty(rows.shape[0], N, device=x.device)
    for e in torch.unique(flat).tolist():
        sel = flat == e
        w = q[e].float() * scales[e].float().repeat_interleave(group, dim=0)
        if zeros is not None:
            w += zeros[e].float().repeat_interleave(group, dim=0)
        out[sel] = rows[sel] @ w
    return out.view(t, topk, N)


def write(out_dir: Path, result: dict[str, Any], rows: list[Row], copy_bw: float) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = result["device"].replace(" ", "-")
    (out_dir / f"trtllm_moe-{slug}.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# trtllm_moe: W8A16 Triton grouped GEMM vs bf16 per-expert cuBLAS — {result['device']}",
        "",
        f"E = {E}, top-{TOPK}, K = {K}, N = {N}, group 128 symmetric, bf16 activations; "
        f"torch {result['torch']}, triton {result['triton']}; copy ceiling "
        f"{copy_bw / 1e12:.2f} TB/s (read + written). Medians of do_bench; 'graph' = CUDA-graph replay.",
        "",
        "| T | experts touched | bf16 ms (graph) | bf16 ms (eager) | w8a16 ms (graph) | w8a16 ms (eager) "
        "| kernel alone ms | speed-up (graph) | w8a16 share of copy | bf16 share of copy | rel err | tile |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        w8_share = r.w8_bytes / (r.w8_graph_ms * 1e-3) / copy_bw
        bf_share = r.bf16_bytes / (r.bf16_graph_ms * 1e-3) / copy_bw
        lines.append(
            f"| {r.T} | {r.experts_touched} | {r.bf16_graph_ms:.4f} | {r.bf16_ms:.4f} | {r.w8_graph_ms:.4f} "
            f"| {r.w8_ms:.4f} | {r.kernel_ms:.4f} | {r.speedup():.2f}× | {w8_share:.0%} | {bf_share:.0%} "
            f"| {r.rel_err:.1e} | {r.tile} |"
        )
    lines += ["", "TFLOP/s at T = 4096: " + ", ".join(
        f"bf16 {r.flops / (r.bf16_graph_ms * 1e-3) / 1e12:.0f}, w8a16 {r.flops / (r.w8_graph_ms * 1e-3) / 1e12:.0f}"
        for r in rows if r.T == 4096)]
    if result.get("asym"):
        lines += ["", "Asymmetric (group 128, zeros), default tiles:", "",
                  "| T | bf16 ms (graph) | w8a16 asym ms (graph) | speed-up | rel err | tile |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {a['T']} | {a['bf16_graph_ms']:.4f} | {a['w8_graph_ms']:.4f} | "
                  f"{a['bf16_graph_ms'] / a['w8_graph_ms']:.2f}× | {a['rel_err']:.1e} | {a['tile']} |"
                  for a in result["asym"]]
    (out_dir / f"trtllm_moe-{slug}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--sweep", action="store_true", help="try several tiles per T and keep the fastest")
    ap.add_argument("--quick", action="store_true", help="T = 1 and 16 only")
    args = ap.parse_args()
    run(args.out, args.sweep, args.quick)


if __name__ == "__main__":
    main()
