"""Run a function in ``world`` processes that meet through ``torch.distributed`` — and
never wait on them forever. What the tensor-parallel check (``conformance/tp``) and the
``tp_linear`` benchmark start their ranks with; usable for any per-rank entry point.

An entry is ``"package.module:function"``, called in each rank as ``function(ctx, argv)``
with a :class:`RankContext` and the arguments the caller added; it returns the exit code.
It should build everything that can refuse first and only then call ``ctx.join()`` (the
rendezvous): a :class:`~quantcore.errors.QuantCoreError` raised before it makes the rank
exit with code 3 and ``REFUSED <error>`` on stderr, and since every rank refuses alike,
none is left waiting at the rendezvous.

* No port to pick: the ranks rendezvous through a ``FileStore`` in a fresh folder
  (``init_method="file://…"``), so parallel runs cannot collide. Gloo still opens its own
  sockets; ``GLOO_SOCKET_IFNAME`` defaults to the loopback interface so a machine whose
  hostname does not resolve still works.
* Every collective has the rank's ``--timeout``; the whole launch has ``timeout_s``; when
  one rank fails the others get ``grace_s``; whatever still runs then is killed with its
  process group. Output goes to files, so a chatty rank cannot block on a full pipe.

    python -m quantcore.checkpoint.launch ENTRY --rank R --world W --store PATH
        [--backend gloo|nccl] [--device cpu|cuda|cuda:rank|cuda:shared] [--timeout S] [--threads N] [--out DIR] ...
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InvalidArgumentError, QuantCoreError

__all__ = ["REFUSED", "RankContext", "RankResult", "launch", "main"]

#: The exit code of a rank whose entry refused (a QuantCoreError).
REFUSED = 3


@dataclass
class RankContext:
    """One rank's place: its number, the group's size, the rendezvous, the device."""

    rank: int
    world: int
    store: str
    backend: str
    device: torch.device
    timeout_s: float
    threads: int
    out: Path

    def join(self) -> None:
        """The rendezvous: ``init_process_group`` with the rank's timeout. Call it after
        everything that can refuse has been built."""
        import torch.distributed as dist

        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        extra: dict[str, Any] = {"device_id": self.device} if self.backend == "nccl" else {}
        dist.init_process_group(
            self.backend, init_method=f"file://{self.store}", rank=self.rank, world_size=self.world,
            timeout=datetime.timedelta(seconds=self.timeout_s), **extra,
        )

    def leave(self) -> None:
        """Destroy the process group if this rank joined one (no collective: a peer that
        failed cannot make it wait)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _device(text: str, rank: int) -> torch.device:
    """``cpu``; ``cuda`` (every rank on GPU 0); ``cuda:rank`` (one GPU per rank);
    ``cuda:shared`` (the ranks dealt round-robin over the GPUs: four ranks on two GPUs)."""
    if text == "cuda:rank":
        return torch.device("cuda", rank)
    if text == "cuda:shared":
        return torch.device("cuda", rank % max(1, torch.cuda.device_count()))
    dev = torch.device(text)
    return torch.device("cuda", 0) if dev.type == "cuda" and dev.index is None else dev


def _entry(name: str) -> Callable[[RankContext, list[str]], int]:
    module, _, function = name.partition(":")
    if not module or not function:
        raise InvalidArgumentError(f"entry: expected 'package.module:function', got {name!r}")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    """One rank: parse the common arguments, call the entry with the rest."""
    p = argparse.ArgumentParser(prog="quantcore.checkpoint.launch")
    p.add_argument("entry", help="package.module:function, called as function(ctx, argv)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True, help="FileStore path for the rendezvous")
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda (every rank on GPU 0), cuda:rank (one GPU each) or cuda:shared (round-robin)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any collective may wait")
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / world)")
    p.add_argument("--out", default=".", help="where the entry writes its results")
    args, rest = p.parse_known_args(argv)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.world)
    torch.set_num_threads(threads)
    ctx = RankContext(args.rank, args.world, args.store, args.backend, _device(args.device, args.rank),
                      args.timeout, threads, Path(args.out))
    try:
        return _entry(args.entry)(ctx, rest)
    except QuantCoreError as exc:
        print(f"REFUSED {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return REFUSED
    finally:
        ctx.leave()


@dataclass(frozen=True)
class RankResult:
    rank: int
    returncode: int | None  # None: killed at the deadline
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def launch(
    world: int,
    entry: str,
    args: Sequence[str],
    *,
    timeout_s: float = 120.0,
    grace_s: float = 15.0,
    env: Mapping[str, str] | None = None,
    workdir: str | Path | None = None,
) -> list[RankResult]:
    """Run ``entry`` in ``world`` processes (``args`` added to each rank's command line);
    return each rank's exit code and output once all have ended or been killed."""
    folder = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="quantcore-tp-"))
    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "store"
    store.unlink(missing_ok=True)
    base_env = {**os.environ, **(env or {})}
    base_env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    base_env.setdefault("PYTHONUNBUFFERED", "1")
    procs, files = [], []
    start = time.monotonic()
    for rank in range(world):
        out = open(folder / f"rank{rank}.out", "wb")  # noqa: SIM115 - closed below
        err = open(folder / f"rank{rank}.err", "wb")  # noqa: SIM115
        files.append((out, err))
        cmd = [sys.executable, "-m", "quantcore.checkpoint.launch", entry, "--rank", str(rank),
               "--world", str(world), "--store", str(store), *args]
        procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=base_env, start_new_session=True))
    ends: list[float | None] = [None] * world
    deadline = start + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            for r, p in enumerate(procs):
                if ends[r] is None and p.poll() is not None:
                    ends[r] = now
            if any(p.returncode not in (None, 0) for p in procs):
                deadline = min(deadline, min(e for e in ends if e is not None) + grace_s)
            if now > deadline:
                break
            time.sleep(0.05)
    finally:
        killed = [p.poll() is None for p in procs]
        for p in procs:
            _kill(p)
        for out, err in files:
            out.close()
            err.close()
    return [
        RankResult(r, None if killed[r] else p.returncode,
                   (folder / f"rank{r}.out").read_text(errors="replace"),
                   (folder / f"rank{r}.err").read_text(errors="replace"),
                   (ends[r] or time.monotonic()) - start)
        for r, p in enumerate(procs)
    ]


if __name__ == "__main__":
    sys.exit(main())
