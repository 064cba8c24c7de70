"""Files quantcore reads on its own: the kernel-times cache and the shipped tables.

Each example puts one thing where a table is looked for (``$QUANTCORE_CACHE``, set,
empty or unset, and the package's tables folder): a FIFO nobody writes to, a symlink to
an endless device, a directory, a sparse file far larger than any table, garbage or
non-UTF-8 bytes, JSON of the wrong shape, a table for another device or naming kernels
that are not registered, a well-formed table. ``get_kernel``, ``explain`` and a cache
``store`` must answer within seconds — a registered kernel, ignoring what they cannot
read with a warning — never hang, never raise, never write outside the cache folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore import measured
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import Kernel
from quantcore.probe import probe
from quantcore.problem import Problem
from quantcore.selection import explain, get_kernel
from quantcore.selection.state import selection_state

from .fuzz.profiles import examples
from .fuzz.seeds import registry
from .fuzz.tally import attempt

FMT = GPTQ(group_size=32, sym=False)
P = Problem.linear(FMT, M=2, K=128, N=64, dtype=torch.float32)
DEVICE_NAME = probe("cpu").name
#: Enough for a blocked read to show: every action here answers in well under a second.
TIMEOUT_S = 20.0


def table(device: str = DEVICE_NAME, kernels: tuple[str, ...] = ("aten_cpu", "torch_fallback")) -> dict[str, Any]:
    key = measured.entry_key(P)
    return {"schema": measured.SCHEMA, "device_name": device, "entries": {
        key: {"seconds": {k: 1e-5 * (i + 1) for i, k in enumerate(kernels)}, "refused": {}, "timing": "perf_counter",
              "versions": measured.versions()}}}


def plant(path: Path, kind: str) -> None:
    """Put ``kind`` at ``path`` (its folder exists)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "endless":
        path.symlink_to("/dev/zero")
    elif kind == "random device":
        path.symlink_to("/dev/urandom")
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling symlink":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "sparse 1 GiB":
        with open(path, "wb") as f:
            f.truncate(1 << 30)
    elif kind == "garbage":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "non-UTF-8":
        path.write_bytes(b'{"schema": "\xff\xfe"}')
    elif kind == "truncated JSON":
        path.write_text(json.dumps(table())[:-7])
    elif kind == "a list":
        path.write_text("[1, 2, 3]")
    elif kind == "wrong types":
        data = table()
        next(iter(data["entries"].values()))["seconds"] = {"aten_cpu": "fast"}
        path.write_text(json.dumps(data))
    elif kind == "deeply nested":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "another device":
        path.write_text(json.dumps(table(device="some-other-card")))
    elif kind == "unknown kernels":
        path.write_text(json.dumps(table(kernels=("no_such_kernel", "aten_cpu"))))
    elif kind == "well-formed":
        path.write_text(json.dumps(table()))
    else:
        raise AssertionError(kind)


KINDS = ("fifo", "endless", "random device", "directory", "dangling symlink", "sparse 1 GiB", "garbage", "non-UTF-8",
         "truncated JSON", "a list", "wrong types", "deeply nested", "another device", "unknown kernels", "well-formed")


@settings(max_examples=examples("fast"))
@given(kind=st.sampled_from(KINDS), where=st.sampled_from(("cache", "shipped")),
       env=st.sampled_from(("folder", "empty", "spaces")), action=st.sampled_from(("get_kernel", "explain", "store")))
def test_unreadable_tables_never_hang_or_raise(kind: str, where: str, env: str, action: str, tmp_path_factory: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path_factory.mktemp("tables")
    cache, shipped = root / "cache", root / "shipped"
    (cache / "kernel-times").mkdir(parents=True)
    shipped.mkdir()
    home = root / "home"
    monkeypatch.setenv("HOME", str(home))  # an empty variable means ~/.cache/quantcore: this one
    value = {"folder": str(cache), "empty": "", "spaces": "  "}[env]
    monkeypatch.setenv("QUANTCORE_CACHE", value)
    monkeypatch.setattr(measured, "SHIPPED", shipped)
    cache_dir = cache if env == "folder" else home / ".cache" / "quantcore"
    (cache_dir / "kernel-times").mkdir(parents=True, exist_ok=True)
    target = (cache_dir / "kernel-times" if where == "cache" else shipped) / f"{measured.device_slug(DEVICE_NAME)}.json"
    plant(target, kind)
    measured._tables.clear()
    selection_state(registry())._forget_choices()  # each example reads the tables afresh
    # A folder of its own as the current one: another process in the checkout (parallel
    # test groups) cannot add to it, so anything new there was written by this call.
    workdir = root / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    before = set(Path.cwd().iterdir())

    def act() -> Any:
        if action == "get_kernel":
            return get_kernel(FMT, "cpu", problem=P, registry=registry())
        if action == "explain":
            return explain(FMT, "cpu", problem=P, registry=registry()).selected.kernel  # type: ignore[union-attr]
        measured.store(P, DEVICE_NAME, measured.Measurement({"aten_cpu": 1e-5}, {}, "perf_counter", measured.versions()))
        return measured.lookup_cached(P, DEVICE_NAME)

    def judge(result: Any) -> str | None:
        if set(Path.cwd().iterdir()) != before:
            return "wrote into the current folder"
        if measured.cache_dir() != cache_dir:
            return f"the cache folder is {measured.cache_dir()}, expected {cache_dir}"
        if action == "get_kernel" and not isinstance(result, Kernel):
            return f"returned {result!r}"
        if action == "explain" and result not in {e.cls.name for e in registry().kernels("gptq")}:
            return f"selected {result!r}"
        replaceable = kind != "directory"  # a directory where the cache file goes stays (and is warned about)
        if action == "store" and where == "cache" and replaceable and (result is None or "aten_cpu" not in result.seconds):
            return f"the store is not read back: {result!r}"
        return None

    try:
        attempt(f"files:{action}", act, names=(), judge=judge, allow_refusal=False, timeout=TIMEOUT_S,
                context=f"{kind} as the {where} table, QUANTCORE_CACHE={value!r}")
    finally:
        measured._tables.clear()
