"""Tensor-parallel MLP block from one GPTQ checkpoint: ``gate``/``up`` column-parallel,
``down`` row-parallel, the all-reduce in between — W processes through torch.distributed.

Each shape group writes one checkpoint (GPTQ 4-bit g128 sym, the ``gate_proj``,
``up_proj``, ``down_proj`` of a Llama-style block: hidden K, intermediate N), starts W
ranks (:func:`quantcore.checkpoint.launch.launch`), each cuts and prepares its shards and the group times in
lockstep (:mod:`..tp_timing`): the block with its all-reduce, the same without it, the
all-reduce alone, and on one rank the unsharded block (same kernels) and the dense bf16
block. The transport follows the device: gloo on the CPU; on CUDA, NCCL with one GPU per
rank when there are W GPUs, else gloo with every rank on GPU 0 (NCCL refuses two ranks on
one GPU). ``QUANTCORE_TP_BACKEND`` (gloo|nccl) and ``QUANTCORE_TP_DEVICE`` (cuda |
cuda:rank) override. Timing is eager (no CUDA graphs across processes).
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
SHAPES = {
    "default": [{"M": m, "K": _LLAMA[0], "N": _LLAMA[1], "W": 2} for m in (1, 16, 128)],
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
    return backend, rank_device or ("cuda:rank" if backend == "nccl" else "cuda")


def write_block(folder: Path, hidden: int, inter: int, seed: int = 0) -> Path:
    from quantcore.checkpoint import save_checkpoint

    gen = torch.Generator().manual_seed(seed)
    shapes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
    linears = {f"mlp.{name}": FMT.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen)
               for name, (n, k) in shapes.items()}
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
    write_block(folder / "ckpt", k, n)
    (folder / "out").mkdir(exist_ok=True)
    args = ["--checkpoint", str(folder / "ckpt"), "--out", str(folder / "out"),
            "--backend", backend, "--device", rank_device, "--ms", ",".join(map(str, ms)),
            "--rounds", str(ROUNDS), "--timeout", "300"]
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
        where = f"{data['backend']} on {data['device']}, kernels {data['kernels']}"
        for c in data["cases"]:
            case = BenchCase("tp_linear", f"M{c['M']}-K{k}-N{n}-W{world}", {"M": c["M"], "K": k, "N": n, "W": world})
            for v in c["variants"]:
                note = "; ".join(x for x in (v["note"], where if v["role"] == "kernel" else "") if x)
                case.variants.append(Variant(
                    v["name"], v["role"], _never, v["bytes"], v["flops"], note=note,
                    measured=Timing(v["time_s"], v["spread"], ROUNDS, "lockstep"),
                ))
            yield case


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    notes = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["case"] == case and r["role"] != "skipped"}
        tp = next((r for name, r in mine.items() if name.startswith("tp") and name.endswith("_mlp")), None)
        if tp is None or "unsharded_mlp" not in mine:
            continue
        w = tp["dims"]["W"]
        speed = mine["unsharded_mlp"]["time_s"] / tp["time_s"]
        comm = mine["all_reduce"]["time_s"] / tp["time_s"] if "all_reduce" in mine else float("nan")
        notes.append(f"{case}: {w} ranks {speed:.2f}× the unsharded block on one rank "
                     f"(ideal {w}× where each rank has its own device; ranks sharing one CPU or GPU split it); "
                     f"the all-reduce alone is {100 * comm:.0f}% of the block's time")
    return notes

