"""hopper_wgmma's first-use measurement on a real GPU (``backends/hopper_wgmma/first_use.py``),
forced with ``QUANTCORE_HOPPER_TUNE=always`` into an empty cache: per shape, the first call's
wall time (it compiles and times the candidates), the plan it kept against the table's,
the output against the float reference (dequantize, then matmul), then a second process
that must read the cache (its first call times nothing), and both plans' CUDA-graph
replay time in that process.

    QUANTCORE_HOPPER_TUNE=always QUANTCORE_CACHE=$(mktemp -d) python -m tools.probes.hopper_first_use OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.formats.gptq import GPTQ
from quantcore.timing import time_interleaved

SHAPES = ((1, 4096, 14336), (16, 14336, 4096), (128, 4096, 4096))


def _layer(m: int, k: int, n: int) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    fmt = GPTQ(bits=4, group_size=128, sym=True)
    gen = torch.Generator().manual_seed(k * 7 + n)
    w = torch.randn(n, k, generator=gen) * 0.02
    tensors = fmt.quantize(w)
    kernel = HopperWgmmaGPTQ(fmt, torch.device("cuda"))
    prepared = kernel.prepare({k_: v.cuda() for k_, v in tensors.items()}, dtype=torch.bfloat16)
    x = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)
    ref = x.float() @ fmt.dequantize(tensors, torch.float32).cuda().T
    return kernel, prepared, x, ref


def first_calls() -> dict[str, Any]:
    out = {}
    for m, k, n in SHAPES:
        kernel, prepared, x, ref = _layer(m, k, n)
        torch.cuda.synchronize()
        start = time.perf_counter()
        y = kernel(x, prepared)
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        start = time.perf_counter()
        kernel(x, prepared)
        torch.cuda.synchronize()
        second = time.perf_counter() - start
        rel = float((y.float() - ref).norm() / ref.norm())
        replay = time_interleaved([lambda i, kk=kernel, p=prepared, xx=x: kk(xx, p)], "cuda", rounds=5, graph=True)[0]
        out[f"M{m}-K{k}-N{n}"] = {"kernel": kernel.name, "first_call_s": first, "second_call_s": second,
                                  "rel_error_vs_float": rel, "graph_replay_us": replay.median_s * 1e6}
    return out


def main(path: str) -> None:
    if len(sys.argv) > 2:  # the second process: what the cache gives it
        Path(path).write_text(json.dumps(first_calls()))
        return
    result: dict[str, Any] = {"device_name": torch.cuda.get_device_name(), "tune": os.environ.get("QUANTCORE_HOPPER_TUNE"),
                              "first_process": first_calls()}
    cache = os.path.join(os.environ.get("QUANTCORE_CACHE", ""), "hopper_wgmma")
    result["cache_files"] = {f: json.loads(Path(cache, f).read_text()) for f in sorted(os.listdir(cache)) if f.endswith(".json")} if os.path.isdir(cache) else {}
    subprocess.run([sys.executable, "-m", "tools.probes.hopper_first_use", path + ".second", "second"], check=True)
    result["second_process"] = json.loads(Path(path + ".second").read_text())
    os.remove(path + ".second")
    Path(path).write_text(json.dumps(result, indent=1))
    for label, row in result["first_process"].items():
        again = result["second_process"][label]
        print(f"{label}: first call {row['first_call_s']:.2f} s (again {again['first_call_s']:.3f} s in a new process); "
              f"rel. error {row['rel_error_vs_float']:.2e}; graph {row['graph_replay_us']:.1f} µs vs {again['graph_replay_us']:.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
