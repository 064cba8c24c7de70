"""The tensor-parallel MLP block across real processes: one checkpoint, W ranks meeting
through torch.distributed (:mod:`quantcore.checkpoint.launch`), each building its column-
and row-parallel shards and running the block with the all-reduce between them.

:func:`check_block` judges each layer as the matrix judges one op — the column-parallel
outputs gathered, the row-parallel output (after the all-reduce) on the hidden activation
the ranks really had — against the float64 golden and against the unsharded kernels in
one process, within the conformance tolerance; every rank must hold the same sum.

Rank entries (``function(ctx, argv)`` for the launcher): :func:`check_rank` runs the
block on a saved input; :func:`mixed_rank` builds a row-parallel layer from a pre-sharded
set whose shards come from two checkpoints, which must be refused on every rank.

    python -m quantcore.conformance.tp.processes --world 2 [--backend gloo|nccl] [--device cpu|cuda|cuda:rank]
        [--format gptq|awq] [--bits 4|8] [--desc-act [--act-order replicate|groups]]
        [--all-reduce backend|one_shot|auto] [--no-fuse]

prints one JSON line and exits 0 when every comparison passes, 2 when the check cannot
run here (``--all-reduce one_shot`` without symmetric memory: the reason in ``skipped``),
1 otherwise. The gloo test (``tests/tp/test_gloo.py``) and ``tools/probes/tp_linear_gpu.sh``
run it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from quantcore.checkpoint.allreduce import PATHS
from quantcore.checkpoint.launch import RankContext, launch
from quantcore.errors import InvalidArgumentError, QuantCoreError, ShardError
from quantcore.formats.awq import AWQ
from quantcore.formats.base import Format
from quantcore.formats.gptq import GPTQ

from ..tolerance import compare, tolerance_for

__all__ = ["CHECKPOINT_FORMATS", "check_block", "check_rank", "checkpoint_format", "golden_block", "golden_linear", "mixed_rank", "mlp_layers", "write_mlp"]

CHECK = "quantcore.conformance.tp.processes:check_rank"
MIXED = "quantcore.conformance.tp.processes:mixed_rank"
#: main's exit code when the check could not run here (its reason in the report's ``skipped``).
SKIPPED = 2


def _rank_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tp rank")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--other", help="mixed_rank: the checkpoint the odd ranks' shards come from")
    p.add_argument("--prefix", default="mlp")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--input", help="check_rank: a torch.save'd activation")
    p.add_argument("--act-order", default="replicate", choices=("replicate", "groups"),
                   help="how an act-order GPTQ down_proj is cut (see formats/gptq/shard.py)")
    p.add_argument("--stage-host", action="store_true", help="all-reduce through a CPU copy of the output")
    p.add_argument("--all-reduce", default="backend", choices=PATHS,
                   help="check_rank: the group's all-reduce path (quantcore/checkpoint/allreduce.py)")
    p.add_argument("--no-fuse", action="store_true", help="check_rank: gate and up as two layers (fuse_gate_up=False)")
    return p.parse_args(argv)


def check_rank(ctx: RankContext, argv: list[str]) -> int:
    """Build this rank's block (every refusal here), join, run it on ``--input``, save
    the column outputs, the hidden slice and the all-reduced output to ``rankR.pt``.
    Off the backend's path, the output is also all-reduced by the backend (``y_backend``);
    a forced one-shot that cannot run here is a skip, written with its reason."""
    import torch.distributed as dist

    from quantcore.checkpoint import load_checkpoint
    from quantcore.checkpoint.parallel import ParallelQuantMLP, TPGroup
    from quantcore.dtypes import parse_dtype

    args = _rank_args(argv)
    tp = TPGroup(ctx.rank, ctx.world, stage_on_host=args.stage_host, all_reduce_path=args.all_reduce)
    block = ParallelQuantMLP.from_checkpoint(load_checkpoint(args.checkpoint), args.prefix, tp, device=ctx.device,
                                             dtype=parse_dtype(args.dtype), act_order=args.act_order,
                                             fuse_gate_up=not args.no_fuse)
    x = torch.load(args.input).to(ctx.device)
    ctx.join()
    report: dict[str, Any] = {"device": str(ctx.device)}
    try:  # the same answer on every rank: what they hold alike, or their agreed rendezvous
        report["all_reduce"] = block.prepare_all_reduce(x.shape[0])
    except ShardError as exc:
        if args.all_reduce != "one_shot":
            raise
        (ctx.out / f"rank{ctx.rank}.json").write_text(json.dumps({**report, "skipped": str(exc)}))
        dist.barrier()
        return 0
    with torch.no_grad():
        parts = {**block.columns(x), "hidden": block.hidden(x), "y": block(x)}
        if args.all_reduce != "backend":
            backend = TPGroup(ctx.rank, ctx.world, stage_on_host=args.stage_host, all_reduce_path="backend")
            parts["y_backend"] = backend.all_reduce(block.partial(x))
    if block.down.shard.index is not None:
        parts["index"] = block.down.shard.index
    torch.save({k: v.cpu() for k, v in parts.items()}, ctx.out / f"rank{ctx.rank}.pt")
    report["kernels"] = block.kernels()
    report["unfused_why"] = block.unfused_why
    (ctx.out / f"rank{ctx.rank}.json").write_text(json.dumps(report))
    dist.barrier()
    return 0


def mixed_rank(ctx: RankContext, argv: list[str]) -> int:
    """A pre-sharded ``down_proj`` whose even ranks' shards come from ``--checkpoint`` and
    odd ranks' from ``--other``: every rank reads the whole list and must refuse it."""
    from quantcore.checkpoint import load_checkpoint
    from quantcore.checkpoint.parallel import RowParallelQuantLinear, TPGroup

    args = _rank_args(argv)
    ckpts = [load_checkpoint(args.checkpoint), load_checkpoint(args.other)]
    name = f"{args.prefix}.down_proj"
    shards = [ckpts[r % 2].format.shard(ckpts[r % 2].linears[name], dim="K", rank=r, world=ctx.world)
              for r in range(ctx.world)]
    RowParallelQuantLinear.from_shards(shards, TPGroup(ctx.rank, ctx.world), device=ctx.device)
    print("mixed shards were accepted", file=sys.stderr)
    return 1


#: The formats a checkpoint is written in (quantcore/checkpoint/writer.py), by name.
CHECKPOINT_FORMATS = {"gptq": GPTQ, "awq": AWQ}


def checkpoint_format(name: str, *, bits: int = 4, group_size: int = 128, desc_act: bool = False) -> Format:
    """The format the check writes its checkpoint in: GPTQ symmetric (act-order with
    ``desc_act``), or AWQ (asymmetric, as AutoAWQ writes it)."""
    if name not in CHECKPOINT_FORMATS:
        raise InvalidArgumentError(f"format: expected one of {sorted(CHECKPOINT_FORMATS)}, got {name!r}")
    if name == "awq":
        if desc_act:
            raise InvalidArgumentError("desc_act: AWQ has no act-order; pass it with format='gptq' only")
        return AWQ(bits=bits, group_size=group_size)
    return GPTQ(bits=bits, group_size=group_size, sym=True, desc_act=desc_act)


def mlp_layers(fmt: Format, hidden: int, inter: int, seed: int = 0, *, bias: bool = True,
               shared_order: bool = True) -> dict[str, dict[str, torch.Tensor]]:
    """gate/up ``[inter, hidden]`` and down ``[hidden, inter]``, random, through the golden
    quantizer; with ``bias`` up and down carry one (down's is added once, on rank 0).
    With ``shared_order`` gate and up get the quantizer's same draw (an act-order column
    order, a rotation), as GPTQ gives two layers on one input: they can be fused."""
    gen = torch.Generator().manual_seed(seed)
    layers = {}
    for name, (n, k) in {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}.items():
        draw = torch.Generator().manual_seed(seed + 1) if shared_order and name != "down_proj" else gen
        tensors = dict(fmt.quantize(torch.randn(n, k, generator=gen) * 0.05, generator=draw))
        if bias and name != "gate_proj":
            tensors["bias"] = (torch.randn(n, generator=gen) * 0.1).to(torch.float16)
        layers[f"mlp.{name}"] = tensors
    return layers


def write_mlp(folder: Path, fmt: Format, hidden: int, inter: int, seed: int = 0, *, shared_order: bool = True) -> Path:
    from quantcore.checkpoint import save_checkpoint

    return save_checkpoint(folder, fmt, mlp_layers(fmt, hidden, inter, seed, shared_order=shared_order))


def golden_linear(fmt: Format, tensors: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``x Wᵀ + b`` in float64 from the golden dequantization."""
    t = {k: w.cpu() for k, w in tensors.items()}
    y = x.double().cpu() @ fmt.dequantize(t, dtype=torch.float64).T
    return y + t["bias"].double() if "bias" in t else y


def golden_block(fmt: Format, layers: dict[str, dict[str, torch.Tensor]], x: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate(x)) · up(x))`` in float64, every intermediate rounded to x's dtype
    where the kernels round it (each linear's output, the SiLU, the product)."""
    r = x.dtype
    gate = golden_linear(fmt, layers["mlp.gate_proj"], x).to(r)
    up = golden_linear(fmt, layers["mlp.up_proj"], x).to(r)
    h = (torch.nn.functional.silu(gate.float()).to(r) * up).to(r)
    return golden_linear(fmt, layers["mlp.down_proj"], h)


def check_block(
    folder: Path,
    *,
    world: int,
    backend: str = "gloo",
    device: str = "cpu",
    fmt: Format | None = None,
    hidden: int = 256,
    inter: int = 512,
    m: int = 5,
    threads: int = 1,
    timeout_s: float = 180.0,
    extra: list[str] | None = None,
    act_order: str = "replicate",
    all_reduce: str = "backend",
    fuse_gate_up: bool = True,
    shared_order: bool = True,
) -> dict[str, Any]:
    """Write the checkpoint under ``folder``, run the ranks in check mode, compare. With
    ``all_reduce`` off the backend's path, its sum is also judged against the backend's;
    where a forced one-shot cannot run the report is a skip (``skipped``: the reason).
    ``fuse_gate_up`` as in :class:`~quantcore.checkpoint.parallel.ParallelQuantMLP` (the
    ranks and the unsharded block alike); ``shared_order`` as in :func:`mlp_layers`.
    The ranks' outputs stay in ``folder/out/rank{r}.pt``."""
    from quantcore.checkpoint import load_checkpoint
    from quantcore.checkpoint.parallel import ParallelQuantMLP, TPGroup


    fmt = fmt or GPTQ(bits=4, group_size=64, sym=False)
    write_mlp(folder / "ckpt", fmt, hidden, inter, shared_order=shared_order)
    x = torch.randn(m, hidden, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    torch.save(x, folder / "x.pt")
    (folder / "out").mkdir(exist_ok=True)
    args = ["--checkpoint", str(folder / "ckpt"), "--input", str(folder / "x.pt"),
            "--out", str(folder / "out"), "--backend", backend, "--device", device,
            "--threads", str(threads), "--timeout", "60", "--act-order", act_order, "--all-reduce", all_reduce,
            *(["--no-fuse"] if not fuse_gate_up else []), *(extra or [])]
    ranks = launch(world, CHECK, args, timeout_s=timeout_s, workdir=folder / "run")
    report: dict[str, Any] = {"world": world, "backend": backend, "device": device, "format": fmt.slug,
                              "stage_on_host": "--stage-host" in (extra or []), "act_order": act_order,
                              "all_reduce_path": all_reduce, "fuse_gate_up": fuse_gate_up,
                              "ranks": [{"rank": r.rank, "returncode": r.returncode, "seconds": round(r.seconds, 1),
                                         "stderr_tail": r.stderr[-1500:] if not r.ok else ""} for r in ranks]}
    if not all(r.ok for r in ranks):
        report["ok"] = False
        return report
    infos = [json.loads((folder / "out" / f"rank{r}.json").read_text()) for r in range(world)]
    report["all_reduce"] = [i.get("all_reduce") for i in infos]
    skipped = {i["skipped"] for i in infos if "skipped" in i}
    if skipped:
        report.update(ok=False, skipped="; ".join(sorted(skipped)),
                      # every rank must have skipped: one that ran would have waited for the others
                      problems=[] if len(skipped) == 1 and all("skipped" in i for i in infos) else ["the ranks disagreed"])
        return report
    parts = [torch.load(folder / "out" / f"rank{r}.pt") for r in range(world)]
    ckpt = load_checkpoint(folder / "ckpt")
    local = "cpu" if device == "cpu" else "cuda:0"
    whole = ParallelQuantMLP.from_checkpoint(ckpt, "mlp", TPGroup(0, 1), device=local, act_order=act_order,
                                             fuse_gate_up=fuse_gate_up)
    tol = tolerance_for(torch.bfloat16)
    # Under act_order="groups" rank r's columns are the inputs its down shard reads (its
    # index), so the gathered columns are put back in the layer's order first.
    order = torch.cat([p["index"] for p in parts]) if "index" in parts[0] else None

    def gathered(name: str) -> torch.Tensor:
        cat = torch.cat([p[name] for p in parts], dim=-1)
        if order is None:
            return cat
        out = torch.empty_like(cat)
        out[..., order] = cat
        return out

    y, h = parts[0]["y"], gathered("hidden")
    # Each layer is one op, judged as the matrix judges it: the column-parallel outputs
    # gathered, the row-parallel output given the hidden activation the ranks really
    # had; against the float64 golden and against the unsharded kernels (one process).
    layers = {"up": ("mlp.up_proj", x), "down": ("mlp.down_proj", h)}
    if whole.gated:
        layers["gate"] = ("mlp.gate_proj", x)
    judged: dict[str, Any] = {}
    ok = all(torch.equal(p["y"], y) for p in parts)  # the all-reduce left every rank the same sum
    ok = ok and len(set(report["all_reduce"])) == 1  # and every rank took the same path
    with torch.no_grad():
        columns = whole.columns(x.to(local))
        for name, (leaf, inp) in layers.items():
            got = y if name == "down" else gathered(name)
            mine = (whole.down(inp.to(local)) if name == "down" else columns[name]).cpu()
            vs_g = compare(got, golden_linear(fmt, ckpt.linears[leaf], inp), tol)
            vs_u = compare(got, mine.double(), tol)
            judged[name] = {"rel_vs_golden": vs_g.rel_err, "max_vs_golden": vs_g.max_err,
                            "rel_vs_unsharded": vs_u.rel_err, "max_vs_unsharded": vs_u.max_err,
                            "problems": [c.problem for c in (vs_g, vs_u) if c.problem]}
            ok = ok and vs_g.ok and vs_u.ok
        block = compare(y, whole(x.to(local)).cpu().double(), tol)
    if "y_backend" in parts[0]:  # the chosen path's sum against the backend's, on the same partial outputs
        vs_b = compare(y, parts[0]["y_backend"].double(), tol)
        report["all_reduce_vs_backend"] = {"rel": vs_b.rel_err, "max": vs_b.max_err,
                                           "problems": [vs_b.problem] if vs_b.problem else []}
        ok = ok and vs_b.ok
    report.update(
        kernels=[i["kernels"] for i in infos],
        unsharded_kernels=whole.kernels(),
        # why gate and up ran as two layers, per rank ("" where they ran as one launch)
        unfused_why=[i["unfused_why"] for i in infos], unsharded_unfused_why=whole.unfused_why,
        layers=judged, tolerance={"rel": tol.rel, "max": tol.max},
        # The block end to end composes two ops' roundings, beyond one op's tolerance: shown, not judged.
        block_rel_vs_unsharded=block.rel_err,
        block_rel_vs_golden=compare(y, golden_block(fmt, ckpt.linears, x), tol).rel_err,
        shape=list(y.shape), dtype=str(y.dtype), ok=ok,
    )
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="quantcore.conformance.tp.processes")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument("--device", default="cpu", help="cpu, cuda (every rank on GPU 0) or cuda:rank")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--inter", type=int, default=2816)
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--format", default="gptq", choices=tuple(CHECKPOINT_FORMATS),
                   help="the checkpoint's format (those a checkpoint is written in)")
    p.add_argument("--bits", type=int, default=4, help="gptq: 4 or 8; awq: 4")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--desc-act", action="store_true", help="gptq: act-order (its down_proj cut as --act-order says)")
    p.add_argument("--act-order", default="replicate", choices=("replicate", "groups"),
                   help="how an act-order down_proj is cut (formats/gptq/shard.py)")
    p.add_argument("--stage-host", action="store_true", help="all-reduce through a CPU copy of the output")
    p.add_argument("--all-reduce", default="backend", choices=PATHS, help="the group's all-reduce path")
    p.add_argument("--no-fuse", action="store_true", help="gate and up as two layers per rank")
    args = p.parse_args(argv)
    try:
        fmt = checkpoint_format(args.format, bits=args.bits, group_size=args.group_size, desc_act=args.desc_act)
    except QuantCoreError as exc:  # a bad combination of options: said as argparse says it
        p.error(str(exc))
    with tempfile.TemporaryDirectory(prefix="quantcore-tp-check-") as tmp:
        report = check_block(Path(tmp), world=args.world, backend=args.backend, device=args.device, fmt=fmt,
                             hidden=args.hidden, inter=args.inter, m=args.m, threads=0,
                             extra=["--stage-host"] if args.stage_host else [], all_reduce=args.all_reduce,
                             fuse_gate_up=not args.no_fuse, act_order=args.act_order)
    print(json.dumps(report))
    if "skipped" in report and not report.get("problems"):
        return SKIPPED
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
