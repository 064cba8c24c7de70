"""One rank of a tensor-parallel MLP run through ``torch.distributed``; started by
:func:`quantcore.benchmarks.tp_launch.launch` (the ``tp_linear`` suite, the gloo tests,
``benchmarks/probes/tp_linear_gpu.sh``).

Order of work, so that no rank can hang: parse, load the checkpoint, cut and prepare
every layer (every refusal happens here, alike on every rank, and the rank exits with
code 3 and ``REFUSED …`` on stderr), and only then join the process group — with a
timeout — and run. Modes:

``check``  run the block on ``--input``; each rank writes its column-parallel outputs, its
           slice of the hidden activation and the all-reduced output to ``--out/rankR.pt``
``bench``  time the block, its parts and its peers in lockstep (:mod:`.tp_timing`);
           rank 0 writes ``--out/bench.json``
``mixed``  build the row-parallel ``down_proj`` from a pre-sharded set whose shards come
           from two checkpoints (``--checkpoint`` and ``--other``): must be refused
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from quantcore.dtypes import parse_dtype
from quantcore.errors import QuantCoreError

REFUSED = 3


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tp_worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True, help="FileStore path for the rendezvous")
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument("--device", default="cpu", help="cpu, cuda (every rank on cuda:0) or cuda:rank (one GPU per rank)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--other", help="mixed mode: the checkpoint the odd ranks' shards come from")
    p.add_argument("--prefix", default="mlp")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--mode", default="check", choices=("check", "bench", "mixed"))
    p.add_argument("--input", help="check mode: a torch.save'd activation")
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / world)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any collective may wait")
    p.add_argument("--ms", default="1,16", help="bench mode: activation rows")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--act-order", default="replicate", choices=("replicate", "groups"),
                   help="how an act-order GPTQ down_proj is cut (see formats/gptq/shard.py)")
    p.add_argument("--stage-host", action="store_true",
                   default=os.environ.get("QUANTCORE_TP_STAGE_HOST") == "1",
                   help="all-reduce through a CPU copy (a backend without device tensors); also QUANTCORE_TP_STAGE_HOST=1")
    return p.parse_args(argv)


def device_of(args: argparse.Namespace) -> torch.device:
    if args.device == "cuda:rank":
        return torch.device("cuda", args.rank)
    dev = torch.device(args.device)
    return torch.device("cuda", 0) if dev.type == "cuda" and dev.index is None else dev


def build(args: argparse.Namespace, device: torch.device) -> Any:
    """Every cut and prepare of this rank; raises on a refusal, before any collective."""
    from quantcore.checkpoint import load_checkpoint
    from quantcore.checkpoint.parallel import ParallelQuantMLP, RowParallelQuantLinear, TPGroup

    tp = TPGroup(args.rank, args.world, stage_on_host=args.stage_host)
    dtype = parse_dtype(args.dtype)
    ckpt = load_checkpoint(args.checkpoint)
    if args.mode == "mixed":
        other = load_checkpoint(args.other)
        name = f"{args.prefix}.down_proj"
        shards = [(other if r % 2 else ckpt).format.shard((other if r % 2 else ckpt).linears[name], dim="K",
                                                          rank=r, world=args.world) for r in range(args.world)]
        return RowParallelQuantLinear.from_shards(shards, tp, device=device, dtype=dtype)
    return ParallelQuantMLP.from_checkpoint(ckpt, args.prefix, tp, device=device, dtype=dtype, act_order=args.act_order)


def join(args: argparse.Namespace, device: torch.device) -> None:
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        args.backend, init_method=f"file://{args.store}", rank=args.rank, world_size=args.world,
        timeout=datetime.timedelta(seconds=args.timeout),
        **({"device_id": device} if args.backend == "nccl" else {}),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.world)
    torch.set_num_threads(threads)
    device = device_of(args)
    out = Path(args.out)
    try:
        module = build(args, device)
    except QuantCoreError as exc:
        print(f"REFUSED {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return REFUSED
    if args.mode == "mixed":
        print("mixed shards were accepted", file=sys.stderr)
        return 1
    join(args, device)
    import torch.distributed as dist

    try:
        if args.mode == "check":
            x = torch.load(args.input).to(device)
            with torch.no_grad():
                parts = {"up": module.up(x), "hidden": module.hidden(x), "y": module(x)}
                if module.gate is not None:
                    parts["gate"] = module.gate(x)
                if module.down.shard.index is not None:
                    parts["index"] = module.down.shard.index
            torch.save({k: v.cpu() for k, v in parts.items()}, out / f"rank{args.rank}.pt")
            kernels = {n: m.local.kernel.name for n, m in (("gate", module.gate), ("up", module.up), ("down", module.down)) if m is not None}
            (out / f"rank{args.rank}.json").write_text(json.dumps({"kernels": kernels, "device": str(device)}))
        else:
            from .tp_timing import bench_rank

            result = bench_rank(args, module, device, threads)
            if args.rank == 0:
                (out / "bench.json").write_text(json.dumps(result, indent=1))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
