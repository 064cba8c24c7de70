"""Defects of the files quantcore reads — caches, checkpoint folders, TurboQuant files — and
of its command line, each pinned as a fixed example (the fuzz suites beside this file
generate their kind)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import quantcore
from quantcore import measured
from quantcore.checkpoint import load_checkpoint
from quantcore.errors import TensorFormatError
from quantcore.formats.gptq import GPTQ
from quantcore.probe import probe
from quantcore.problem import Problem
from quantcore.selection import get_kernel
from quantcore.selection.state import selection_state
from tests.llama_checkpoint import skeleton

from .fuzz.seeds import registry
from .test_fuzz_checkpoints import _config, pristine  # noqa: F401  (the fixture)

FMT = GPTQ(group_size=32, sym=False)
P = Problem.linear(FMT, M=2, K=128, N=64, dtype=torch.float32)


# --- caches --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "endless"])
def test_an_unreadable_cache_file_never_blocks_get_kernel(kind: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO at the measured-times cache path blocked ``get_kernel`` forever; a cache
    pointing at an endless file read until MemoryError."""
    monkeypatch.setenv("QUANTCORE_CACHE", str(tmp_path))
    path = measured.cache_file(probe("cpu").name)
    path.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    measured._tables.clear()
    selection_state(registry())._forget_choices()
    found: list[Any] = []
    worker = threading.Thread(target=lambda: found.append(get_kernel(FMT, "cpu", problem=P, registry=registry())),
                              daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "get_kernel blocked on the cache file"
    assert found and found[0].name in {e.cls.name for e in registry().kernels("gptq")}


def test_an_empty_cache_variable_means_the_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``QUANTCORE_CACHE=""`` wrote into the current folder."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("QUANTCORE_CACHE", "")
    assert measured.cache_dir() == tmp_path / ".cache" / "quantcore"


# --- checkpoint folders --------------------------------------------------------------------------


def _copy(pristine: Path, tmp_path: Path) -> Path:  # noqa: F811
    folder = tmp_path / "model"
    shutil.copytree(pristine, folder)
    return folder


def _first_shard(folder: Path) -> Path:
    return sorted(folder.glob("*.safetensors"))[0]


def _edit(folder: Path, leaf: str, change: Any) -> None:
    from safetensors.torch import load_file, save_file

    for shard in sorted(folder.glob("*.safetensors")):
        tensors = load_file(str(shard))
        names = [k for k in tensors if k.endswith(f".{leaf}")]
        if names:
            tensors[names[0]] = change(tensors[names[0]])
            save_file(tensors, str(shard))
            return


@pytest.mark.parametrize(("spoil", "message"), [
    ("truncated shard", r"model-00001-of-00003\.safetensors: not a readable safetensors file"),
    ("garbage shard", r"model-00001-of-00003\.safetensors: not a readable safetensors file"),
    ("empty g_idx", r"g_idx"),
    ("zero-size scales", r"scales"),
    ("float qweight", r"qweight"),
    ("config a list", r"config\.json: expected a JSON object, got list"),
    ("config null", r"config\.json: expected a JSON object, got NoneType"),
    ("config not UTF-8", r"config\.json: not UTF-8 text"),
    ("weight_map a list", r"model\.safetensors\.index\.json: expected a JSON object whose 'weight_map'"),
    ("index escapes the folder", r"shard '\.\./\.\./x\.safetensors' is outside the checkpoint folder"),
])
@pytest.mark.parametrize("door", ["load_quantized", "load_checkpoint"])
def test_a_spoiled_checkpoint_is_a_tensor_format_error(spoil: str, message: str, door: str, pristine: Path,  # noqa: F811
                                                       tmp_path: Path) -> None:
    folder = _copy(pristine, tmp_path)
    index = folder / "model.safetensors.index.json"
    if spoil == "truncated shard":
        data = _first_shard(folder).read_bytes()
        _first_shard(folder).write_bytes(data[: len(data) // 2])
    elif spoil == "garbage shard":
        _first_shard(folder).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    elif spoil == "empty g_idx":
        _edit(folder, "g_idx", lambda t: t[:0].contiguous())
    elif spoil == "zero-size scales":
        _edit(folder, "scales", lambda t: t[:0].contiguous())
    elif spoil == "float qweight":
        _edit(folder, "qweight", lambda t: t.float())
    elif spoil.startswith("config"):
        (folder / "config.json").write_bytes({"config a list": b"[1, 2]", "config null": b"null",
                                              "config not UTF-8": b'\xff\xfe{}'}[spoil])
    elif spoil == "weight_map a list":
        index.write_text(json.dumps({"weight_map": [1]}))
    else:
        data = json.loads(index.read_text())
        first = sorted(set(data["weight_map"].values()))[0]
        data["weight_map"] = {k: "../../x.safetensors" if v == first else v for k, v in data["weight_map"].items()}
        index.write_text(json.dumps(data))
    with pytest.raises(TensorFormatError, match=message):
        if door == "load_quantized":
            quantcore.load_quantized(skeleton(_config()), folder, dtype=torch.float32)
        else:
            load_checkpoint(folder)


def test_the_hugging_face_cache_layout_still_loads(pristine: Path, tmp_path: Path) -> None:  # noqa: F811
    """Shard names must stay inside the folder; the files themselves may be symlinks
    into ``../../blobs``, as the Hugging Face cache lays a snapshot out."""
    snapshot = tmp_path / "models--x" / "snapshots" / "abc"
    blobs = tmp_path / "models--x" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for path in sorted(pristine.iterdir()):
        shutil.copy(path, blobs / path.name)
        (snapshot / path.name).symlink_to(Path("../../blobs") / path.name)
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(0))
    linked = quantcore.load_quantized(skeleton(_config()), snapshot, dtype=torch.float32)
    plain = quantcore.load_quantized(skeleton(_config()), pristine, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(linked(ids).logits, plain(ids).logits)


@pytest.mark.parametrize("spoil", ["not JSON", "a list", "modules a list", "bits a string", "in_features a string",
                                   "group_size huge", "offload without a residual pass"])
def test_a_turboquant_file_with_bad_metadata_is_a_tensor_format_error(spoil: str, tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file
    from torch import nn

    from quantcore.nn.turboquant.model import (
        METADATA_KEY,
        TurboQuantConfig,
        load_quantized,
        quantize_model,
        save_quantized,
    )

    good = tmp_path / "good.safetensors"
    save_quantized(quantize_model(nn.Sequential(nn.Linear(64, 32)), TurboQuantConfig(group_size=32, skip=())), good)
    with safe_open(str(good), framework="pt") as f:
        meta = json.loads(f.metadata()[METADATA_KEY])
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    raw = {"not JSON": "{", "a list": "[]"}.get(spoil)
    if raw is None:
        if spoil == "modules a list":
            meta["modules"] = []
        elif spoil == "bits a string":
            meta["config"]["bits"] = "four"
        elif spoil == "group_size huge":  # found by the nightly fuzz: a refusal that named no file
            meta["config"]["group_size"] = 2**70
        elif spoil == "offload without a residual pass":
            meta["config"]["cpu_offload_pass2"] = True
        else:
            meta["modules"]["0"]["in_features"] = "64"
        raw = json.dumps(meta)
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata={METADATA_KEY: raw})
    with pytest.raises(TensorFormatError, match=str(bad)):
        load_quantized(nn.Sequential(nn.Linear(64, 32, device="meta")), bad)


# --- the command line ------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "line"), [
    (["list", "--json", "{tmp}"], "quantcore list: --json {tmp}: a directory"),
    (["bench", "gptq_linear", "--rounds", "0", "--no-save"], "quantcore bench: --rounds: expected a positive number"),
    (["tune", "gptq", "-M", "abc", "-K", "128", "-N", "64"], "quantcore tune: -M: expected an integer, got 'abc'"),
    (["tune", "gptq", "-K", "128", "-N", "64", "--dim", "X=abc"], "quantcore tune: --dim X: expected an integer"),
    (["tune", "gptq", "-K", "128", "-N", "64", "--export", "{tmp}"], "quantcore tune: --export {tmp}: a directory"),
    (["explain", "gptq", "-K", "-5", "-N", "64"], "quantcore explain: K: expected a size in [0, 16777216], got -5"),
    (["bench", "gptq_linear", "--shape", f"M=1,K={2**40},N=4096", "--no-save"], "quantcore bench: --shape"),
])
def test_the_command_line_says_one_line_and_exits_2(argv: list[str], line: str, tmp_path: Path) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out = subprocess.run([sys.executable, "-m", "quantcore", *argv], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(line.replace("{tmp}", str(tmp_path))), out.stderr
