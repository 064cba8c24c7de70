"""trtllm_moe_triton's CUDA-graph replay time at T = 1, 16, 128 (E = 8, top-2, K = N = 4096,
bf16; the host-cost suite's MoE subject, ``benchmarks/suites/_host_cost.py``) beside
``nn.Linear``, in whichever quantcore is importable — so two trees (two ``pip install
--target`` folders on ``PYTHONPATH``) can be compared on one GPU, one process each:

    python -m tools.probes.trtllm_moe_graph_times LABEL OUT.json
"""

from __future__ import annotations

import json
import sys

import torch

from quantcore.benchmarks.suites._host_cost import subjects
from quantcore.timing import time_interleaved


def main(label: str, path: str) -> None:
    dev = torch.device("cuda", 0)
    out: dict = {"tree": label, "device_name": torch.cuda.get_device_name(dev), "unit": "µs", "rows": {}}
    for m in (1, 16, 128):
        things, _ = subjects(dev, torch.bfloat16, m, 4096, 4096)
        chosen = [s for s in things if "trtllm_moe_triton" in s.name or s.name == "nn.Linear"]
        with torch.inference_mode():
            timings = time_interleaved([s.captured for s in chosen], "cuda", rounds=7, graph=True)
        out["rows"][m] = {s.name: {"us": t.median_s * 1e6, "spread": t.spread, "method": t.method}
                          for s, t in zip(chosen, timings, strict=True)}
        print(label, m, {k: round(v["us"], 2) for k, v in out["rows"][m].items()}, flush=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
