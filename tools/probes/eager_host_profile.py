"""Where the host's time goes in an eager decode step (no torch.compile, no CUDA graph:
the way ``transformers``' ``generate`` runs by default), by Python function: the
``model_decode`` suite's models, each variant's wall time per step measured without a
profiler, then the same steps under ``cProfile`` — the functions that take the most time of
their own, with calls and µs per step, so a variant slower than bf16 in eager shows where.

    python -m tools.probes.eager_host_profile --device cuda --shapes eager \\
        --variants bf16,gptq4-g128-fused,tinygemm --out DIR
    python -m tools.probes.eager_host_profile --device cpu --shapes tiny --variants bf16,gptq4-g128-fused
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from pathlib import Path
from typing import Any

import torch

from quantcore.benchmarks.decode import Decoder
from quantcore.benchmarks.suites import model_decode


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _steps(decoder: Decoder, steps: int, device: str) -> float:
    decoder.restart()
    _sync(device)
    start = time.perf_counter()
    for i in range(steps):
        decoder.step(i)
    _sync(device)
    return time.perf_counter() - start


def profile_variant(name: str, dims: dict[str, int], device: str, steps: int, top: int) -> dict[str, Any]:
    model = model_decode.variant_model(name, dims, device)
    decoder = Decoder(model, batch=dims["B"], prompt=dims["P"], new_tokens=steps, device=device, compile=False)
    decoder.warm_up()
    walls = sorted(_steps(decoder, steps, device) for _ in range(3))
    profiler = cProfile.Profile()
    decoder.restart()
    profiler.enable()
    for i in range(steps):
        decoder.step(i)
    _sync(device)
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (path, line, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = path.split("site-packages/")[-1]
        where = where.removeprefix(str(Path.cwd()) + "/")  # the repository's own files, relative
        rows.append({"function": f"{where}:{line}({func})", "calls_per_step": ncalls / steps,
                     "own_us_per_step": 1e6 * tottime / steps, "cum_us_per_step": 1e6 * cumtime / steps})
    rows.sort(key=lambda r: -r["own_us_per_step"])
    by_cum = sorted(rows, key=lambda r: -r["cum_us_per_step"])
    return {"wall_ms_per_step": 1e3 * walls[1] / steps, "walls_s": walls, "kernels": model_decode.kernels_of(model),
            "top_own": rows[:top], "top_cumulative": by_cum[:top]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shapes", default="tiny", help=f"one of {sorted(model_decode.SHAPES)}")
    parser.add_argument("--variants", default="bf16,gptq4-g128-fused")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    dims = {**model_decode.SHAPES[args.shapes][-1], "C": 0}
    result: dict[str, Any] = {"case": model_decode.label(dims), "device": args.device, "steps": args.steps,
                              "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                              "variants": {}}
    for name in args.variants.split(","):
        result["variants"][name] = got = profile_variant(name, dims, args.device, args.steps, args.top)
        print(f"{name}: {got['wall_ms_per_step']:.3f} ms per eager step ({got['kernels'] or 'dense'})", flush=True)
        for r in got["top_own"][:12]:
            print(f"   {r['own_us_per_step']:9.1f} µs  {r['calls_per_step']:7.1f}×  {r['function'][:110]}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"eager_host_profile-{result['case']}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
