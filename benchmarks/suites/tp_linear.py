"""Tensor-parallel MLP block from one GPTQ checkpoint: ``gate``/``up`` column-parallel,
``down`` row-parallel, the all-reduce in between — W processes through torch.distributed.

Each shape group writes one checkpoint (GPTQ 4-bit g128 sym, the ``gate_proj``,
``up_proj``, ``down_proj`` of a Llama-style block: hidden K, intermediate N), starts W
ranks (:func:`quantcore.checkpoint.launch.launch`), each cuts and prepares its shards and the group times in
lockstep (:mod:`..tp_timing`): the block with its all-reduce, the same without it, the
all-reduce alone, and on one rank the unsharded block (same kernels) and the dense bf16
block. The transport follows the device: gloo on the CPU; on CUDA, NCCL with one GPU per
rank when there are W GPUs, else gloo with the ranks dealt over the GPUs (NCCL refuses two
ranks on one GPU). ``QUANTCORE_TP_BACKEND`` (gloo|nccl) and ``QUANTCORE_TP_DEVICE`` (cuda |
cuda:rank | cuda:shared) override. On CUDA every variant is timed eagerly, as CUDA-graph
replays captured per rank (as engines capture decode) and for what its eager call costs
the host alone (with the block's parts: gate/up, the activation, down), each mode its own
case (``…-graph``, ``…-host``).
The block and the all-reduce alone are timed with the process group's all-reduce and with
the one-shot one over symmetric memory (``…_one_shot``); the row of the all-reduce that
``all_reduce_path="auto"`` picks for the case says so. The block runs gate and up as one
launch per rank; ``…_unfused`` rows time it with two (``fuse_gate_up=False``), in the same run.
Shapes: Llama-2-7B's MLP (hidden 4096, intermediate 11008) and a 70B-class one (8192, 28672).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from quantcore.checkpoint.launch import launch
from quantcore.formats.gptq import GPTQ
from quantcore.timing import Timing

from ..spec import BenchCase, Variant
from ..tp_timing import ENTRY

DESCRIPTION = "tensor-parallel GPTQ MLP block (column- then row-parallel, all-reduce between) over W processes"
GRAPH_SAFE = False
_LLAMA = (4096, 11008)
_LLAMA_70B = (8192, 28672)
SHAPES = {
    "default": [{"M": m, "K": k, "N": n, "W": 2} for k, n in (_LLAMA, _LLAMA_70B) for m in (1, 16, 128)],
    "7b": [{"M": m, "K": _LLAMA[0], "N": _LLAMA[1], "W": 2} for m in (1, 16, 128)],
    "70b": [{"M": m, "K": _LLAMA_70B[0], "N": _LLAMA_70B[1], "W": 2} for m in (1, 16, 128)],
    # The 70B-class MLP over four GPUs: 28672 = 4 · 56 groups of 128, K = 8192 = 4 · 2048.
    "70b-w4": [{"M": m, "K": _LLAMA_70B[0], "N": _LLAMA_70B[1], "W": 4} for m in (1, 16, 128)],
    "decode": [{"M": 1, "K": _LLAMA[0], "N": _LLAMA[1], "W": 2}],
    "small": [{"M": m, "K": 1024, "N": 2816, "W": 2} for m in (1, 16)],
    # Llama-2-13B's MLP: 13824 = 4 · 27 groups of 128 (7B's 11008 = 86 groups splits in 2, not 4).
    "w4": [{"M": m, "K": 5120, "N": 13824, "W": 4} for m in (1, 16, 128)],
}
FMT = GPTQ(bits=4, group_size=128, sym=True)
ROUNDS = 7


def transport(device: str, world: int) -> tuple[str, str]:
    """(torch.distributed backend, the worker's ``--device``) for ``world`` ranks on ``device``."""
    backend, rank_device = os.environ.get("QUANTCORE_TP_BACKEND"), os.environ.get("QUANTCORE_TP_DEVICE")
    if not device.startswith("cuda"):
        return backend or "gloo", rank_device or "cpu"
    if backend is None:
        backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    return backend, rank_device or ("cuda:rank" if backend == "nccl" else "cuda:shared")


def write_block(folder: Path, hidden: int, inter: int, seed: int = 0, device: str = "cpu") -> Path:
    """The block's checkpoint, its random weights drawn and quantized on ``device`` (a
    70B-class block is 700 M weights: seconds on a GPU, minutes on a CPU)."""
    from quantcore.checkpoint import save_checkpoint

    dev = torch.device(device)
    gen = torch.Generator(dev).manual_seed(seed)
    shapes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    linears = {}
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, generator=gen, device=dev) * 0.02
        linears[f"mlp.{name}"] = {t: v.cpu() for t, v in FMT.quantize(w).items()}
        del w
    return save_checkpoint(folder, FMT, linears)


def _never(i: int) -> object:
    raise AssertionError("tp_linear variants are timed by the ranks, not called here")


def _group(shapes: list[dict[str, int]]) -> dict[tuple[int, int, int], list[int]]:
    out: dict[tuple[int, int, int], list[int]] = {}
    for d in shapes:
        out.setdefault((d["K"], d["N"], d.get("W", 2)), []).append(d["M"])
    return out


def run_group(device: str, k: int, n: int, world: int, ms: list[int], folder: Path) -> dict[str, Any]:
    """Write the checkpoint, run the ranks, return rank 0's measurements."""
    backend, rank_device = transport(device, world)
    write_block(folder / "ckpt", k, n, device="cuda" if device.startswith("cuda") else "cpu")
    (folder / "out").mkdir(exist_ok=True)
    args = ["--checkpoint", str(folder / "ckpt"), "--out", str(folder / "out"),
            "--backend", backend, "--device", rank_device, "--ms", ",".join(map(str, ms)),
            "--rounds", str(ROUNDS), "--timeout", "300", *(["--graph", "--host"] if device.startswith("cuda") else [])]
    results = launch(world, ENTRY, args, timeout_s=1800, grace_s=30, workdir=folder / "run")
    if not all(r.ok for r in results):
        tails = "\n".join(f"rank {r.rank} rc={r.returncode}: {r.stderr[-1500:]}" for r in results)
        raise RuntimeError(f"tp_linear: the ranks failed\n{tails}")
    return json.loads((folder / "out" / "bench.json").read_text())  # type: ignore[no-any-return]


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    for (k, n, world), ms in _group(shapes).items():
        folder = Path(tempfile.mkdtemp(prefix="quantcore-tp-bench-"))
        try:
            data = run_group(device, k, n, world, ms, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        fusion = (f"gate and up apart: {data['unfused_why']}" if data.get("unfused_why")
                  else "gate and up as one launch per rank")
        where = f"{data['backend']} on {data['device']}, kernels {data['kernels']}, {fusion}"
        for c in data["cases"]:
            picked = {"backend": "all_reduce", "one_shot": "all_reduce_one_shot"}.get(c.get("auto", ""))
            for mode in dict.fromkeys(v.get("mode", "eager") for v in c["variants"]):
                label = f"M{c['M']}-K{k}-N{n}-W{world}" + ("" if mode == "eager" else f"-{mode}")
                case = BenchCase("tp_linear", label, {"M": c["M"], "K": k, "N": n, "W": world})
                for v in c["variants"]:
                    if v.get("mode", "eager") != mode:
                        continue
                    if v["role"] == "skipped":
                        case.skipped[v["name"]] = v["note"]
                        continue
                    note = "; ".join(x for x in (v["note"], where if v["role"] == "kernel" else "",
                                                 MODE_NOTES.get(mode, ""),
                                                 AUTO_PICKS if v["name"] == picked else "") if x)
                    case.variants.append(Variant(
                        v["name"], v["role"], _never, v["bytes"], v["flops"], note=note,
                        measured=Timing(v["time_s"], v["spread"], ROUNDS, "lockstep" if mode == "eager" else f"lockstep-{mode}"),
                    ))
                yield case


#: What a mode's rows measure, in their note.
MODE_NOTES = {"graph": "CUDA graph per rank",
              "host": "host µs per eager call: issued while a spin kernel holds the GPU"}

#: The note on the all-reduce row that ``all_reduce_path="auto"`` picks for the case.
AUTO_PICKS = 'all_reduce_path="auto" picks this path'


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    """Per case: the group's speed over the unsharded block on one rank, and the
    all-reduce's share of the block's time (eager and CUDA-graph cases alike); the same
    with the one-shot all-reduce where it was timed, and which path ``auto`` picks."""
    notes = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["case"] == case and r["role"] != "skipped"}
        tp = next((r for name, r in mine.items() if name.startswith("tp") and name.endswith("_mlp")), None)
        if tp is None or "unsharded_mlp" not in mine:
            continue
        w = tp["dims"]["W"]
        speed = mine["unsharded_mlp"]["time_s"] / tp["time_s"]
        share = (f"the all-reduce alone is {100 * mine['all_reduce']['time_s'] / tp['time_s']:.0f}% of the block's time"
                 if "all_reduce" in mine else "the all-reduce was not timed alone")
        line = (f"{case}: {w} ranks {speed:.2f}× the unsharded block on one rank "
                f"(ideal {w}× where each rank has its own device; ranks sharing one CPU or GPU split it); {share}")
        one = mine.get(f"tp{w}_mlp_one_shot")
        if one is not None:
            line += f"; with the one-shot all-reduce {mine['unsharded_mlp']['time_s'] / one['time_s']:.2f}×"
            if "all_reduce_one_shot" in mine:
                line += f", the all-reduce {100 * mine['all_reduce_one_shot']['time_s'] / one['time_s']:.0f}% of it"
        graphed = mine.get(f"tp{w}_mlp_graphed")
        if graphed is not None:
            line += f"; replayed from graphs {mine['unsharded_mlp']['time_s'] / graphed['time_s']:.2f}×"
            if "unsharded_mlp_graphed" in mine:
                line += f" ({mine['unsharded_mlp_graphed']['time_s'] / graphed['time_s']:.2f}× the unsharded block replayed)"
        graphed_one = mine.get(f"tp{w}_mlp_graphed_one_shot")
        if graphed_one is not None:
            line += f"; replayed from graphs with the one-shot all-reduce {mine['unsharded_mlp']['time_s'] / graphed_one['time_s']:.2f}×"
        apart = mine.get(f"tp{w}_mlp_unfused")
        if apart is not None:
            line += f"; gate and up fused {apart['time_s'] / tp['time_s']:.2f}× the two launches"
            if "unsharded_mlp_unfused" in mine:
                line += f" ({mine['unsharded_mlp_unfused']['time_s'] / mine['unsharded_mlp']['time_s']:.2f}× unsharded)"
        auto = next((n for n, r in mine.items() if AUTO_PICKS in r.get("note", "")), None)
        if auto is not None:
            line += f"; auto picks {'one-shot' if auto.endswith('_one_shot') else 'the backend'}"
        notes.append(line)
    return notes
