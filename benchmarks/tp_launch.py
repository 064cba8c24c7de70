"""Start ``world`` processes of :mod:`.tp_worker` that meet through ``torch.distributed``,
and never wait on them forever.

* No port to pick: the ranks rendezvous through a ``FileStore`` in a fresh temporary
  folder (``init_method="file://…"``), so parallel runs cannot collide. Gloo still opens
  its own sockets; ``GLOO_SOCKET_IFNAME`` defaults to the loopback interface so a machine
  whose hostname does not resolve still works.
* Every rank gets the same deadline. When one rank fails, the others get
  ``grace_s`` to finish (a refusal happens on every rank alike, so they normally exit
  together); whatever still runs after that is killed with its whole process group.
* Output goes to files, not pipes, so a chatty rank cannot block on a full pipe.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RankResult", "launch"]

WORKER = "quantcore.benchmarks.tp_worker"


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
    args: Sequence[str],
    *,
    timeout_s: float = 120.0,
    grace_s: float = 15.0,
    env: Mapping[str, str] | None = None,
    workdir: str | Path | None = None,
) -> list[RankResult]:
    """Run ``python -m quantcore.benchmarks.tp_worker --rank r --world w --store S ARGS``
    for every rank; return each rank's exit code and output."""
    folder = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="quantcore-tp-"))
    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "store"
    if store.exists():
        store.unlink()
    base_env = {**os.environ, **(env or {})}
    base_env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    base_env.setdefault("PYTHONUNBUFFERED", "1")
    procs, files = [], []
    start = time.monotonic()
    for rank in range(world):
        out = open(folder / f"rank{rank}.out", "wb")  # noqa: SIM115 - closed below
        err = open(folder / f"rank{rank}.err", "wb")  # noqa: SIM115
        files.append((out, err))
        cmd = [sys.executable, "-m", WORKER, "--rank", str(rank), "--world", str(world), "--store", str(store), *args]
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
    results = []
    for r, p in enumerate(procs):
        took = (ends[r] or time.monotonic()) - start
        results.append(RankResult(
            r, None if killed[r] else p.returncode,
            (folder / f"rank{r}.out").read_text(errors="replace"),
            (folder / f"rank{r}.err").read_text(errors="replace"), took,
        ))
    return results
