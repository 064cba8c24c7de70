"""A real multi-process run: two, three or four processes meet through torch.distributed's
gloo backend on the CPU, each builds its column- and row-parallel shards of one MLP
checkpoint, and the block's all-reduce runs between them.

Quick and safe on a 2-core CI machine: ranks rendezvous through a file store (no port
to collide on), every launch has a deadline after which the ranks' process groups are
killed, and a refused build exits before the rendezvous, so a refusal returns in seconds.
"""

from __future__ import annotations

import json

import pytest
import torch

from quantcore.checkpoint.launch import REFUSED, launch
from quantcore.conformance.tp.processes import (
    CHECK,
    MIXED,
    SKIPPED,
    check_block,
    main,
    mlp_layers,
    write_mlp,
)
from quantcore.formats.gptq import GPTQ

pytestmark = pytest.mark.xdist_group("tp-gloo")

FMT = GPTQ(bits=4, group_size=64, sym=False)
HIDDEN, INTER = 256, 512
#: Generous for a loaded 2-core machine (each rank imports torch); a hang would be killed here.
DEADLINE_S = 180.0


def _run(tmp_path, world: int, entry: str, *extra: str) -> list:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    args = ["--checkpoint", str(tmp_path / "ckpt"), "--out", str(out), "--threads", "1", "--timeout", "60", *extra]
    return launch(world, entry, args, timeout_s=DEADLINE_S, workdir=tmp_path / "run")


def _describe(results) -> str:
    return "\n".join(f"rank {r.rank}: rc={r.returncode} after {r.seconds:.1f}s\n{r.stderr[-2000:]}" for r in results)


def test_two_gloo_ranks_match_the_unsharded_block_and_the_golden(tmp_path):
    report = check_block(tmp_path, world=2, fmt=FMT, hidden=HIDDEN, inter=INTER, timeout_s=DEADLINE_S)
    assert report["ok"], report
    assert report["shape"] == [5, HIDDEN] and report["dtype"] == "torch.bfloat16"
    # Each rank ran its shards through the CPU's int4pack kernel, as the unsharded block does.
    aten = {"gate": "aten_cpu", "up": "aten_cpu", "down": "aten_cpu"}
    assert report["kernels"] == [aten, aten] and report["unsharded_kernels"] == aten, report
    assert report["unfused_why"] == ["", ""], report  # gate and up ran as one launch per rank


def test_two_gloo_ranks_give_the_same_bits_with_gate_and_up_fused_or_apart(tmp_path):
    runs = {}
    for fuse in (True, False):
        folder = tmp_path / ("fused" if fuse else "apart")
        folder.mkdir()
        report = check_block(folder, world=2, fmt=FMT, hidden=HIDDEN, inter=INTER, timeout_s=DEADLINE_S,
                             fuse_gate_up=fuse)
        assert report["ok"], report
        assert report["unfused_why"] == (["", ""] if fuse else ["fuse_gate_up=False"] * 2), report
        runs[fuse] = [torch.load(folder / "out" / f"rank{r}.pt") for r in range(2)]
    for fused, apart in zip(runs[True], runs[False], strict=True):
        assert fused.keys() == apart.keys()
        assert all(torch.equal(fused[k], apart[k]) for k in apart), [k for k in apart if not torch.equal(fused[k], apart[k])]


def test_four_gloo_ranks_match_the_unsharded_block_and_the_golden(tmp_path):
    """World 4: the intermediate (512) in quarters of two groups each, the hidden (256) in
    quarters for gate and up; every rank on the CPU's int4pack kernel."""
    report = check_block(tmp_path, world=4, fmt=FMT, hidden=HIDDEN, inter=INTER, timeout_s=DEADLINE_S)
    assert report["ok"], report
    aten = {"gate": "aten_cpu", "up": "aten_cpu", "down": "aten_cpu"}
    assert report["kernels"] == [aten] * 4 and len(report["ranks"]) == 4, report
    assert report["unfused_why"] == [""] * 4, report
    assert all(layer["rel_vs_golden"] < report["tolerance"]["rel"] for layer in report["layers"].values())


def test_an_act_order_block_cut_by_whole_groups_runs_every_rank_on_the_int4pack_kernel(tmp_path):
    act = GPTQ(bits=4, group_size=64, sym=False, desc_act=True)
    report = check_block(tmp_path, world=2, fmt=act, hidden=HIDDEN, inter=INTER, timeout_s=DEADLINE_S, act_order="groups")
    assert report["ok"], report
    aten = {"gate": "aten_cpu", "up": "aten_cpu", "down": "aten_cpu"}
    assert report["kernels"] == [aten, aten], report
    assert report["unfused_why"] == ["", ""], report  # gate and up share g_idx: one launch, indexed columns


@pytest.mark.parametrize(("argv", "slug", "world"), [
    (["--format", "awq"], "awq4-g64", 4),
    (["--format", "gptq", "--bits", "8"], "gptq8-g64-sym", 2),
    (["--format", "gptq", "--desc-act", "--act-order", "groups"], "gptq4-g64-sym-act", 2),
])
def test_the_check_command_runs_every_checkpoint_format(capsys, argv, slug, world):
    """What the GPU probe runs per format (NCCL there), on gloo: each layer within the
    tolerance of the golden and of the unsharded kernels, every rank the same sum."""
    rc = main(["--world", str(world), "--hidden", str(HIDDEN), "--inter", str(INTER), "--m", "4",
               "--group-size", "64", *argv])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and report["ok"], report
    assert report["format"] == slug and len(report["ranks"]) == world, report
    assert all(not layer["problems"] for layer in report["layers"].values()), report


@pytest.mark.parametrize(("argv", "words"), [
    (["--format", "awq", "--desc-act"], "AWQ has no act-order"),
    (["--format", "awq", "--bits", "8"], "awq bits"),
    (["--format", "exl2"], "invalid choice: 'exl2'"),
])
def test_the_check_command_refuses_a_format_it_cannot_write_naming_the_option(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and words in capsys.readouterr().err


def test_auto_all_reduce_on_gloo_takes_the_backend_on_every_rank(tmp_path):
    report = check_block(tmp_path, world=2, fmt=FMT, hidden=HIDDEN, inter=INTER, timeout_s=DEADLINE_S, all_reduce="auto")
    assert report["ok"], report
    assert report["all_reduce"] == ["backend", "backend"]
    # the backend's sum against itself: the same partial outputs, the same sum
    assert report["all_reduce_vs_backend"]["max"] == 0.0, report


def test_a_forced_one_shot_all_reduce_on_gloo_is_a_skip_on_every_rank_with_its_reason(capsys):
    rc = main(["--world", "2", "--hidden", str(HIDDEN), "--inter", str(INTER), "--m", "4", "--group-size", "64",
               "--all-reduce", "one_shot"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == SKIPPED and not report["ok"] and report["problems"] == [], report
    assert "the one-shot all-reduce needs CUDA" in report["skipped"], report
    assert all(r["returncode"] == 0 for r in report["ranks"]), report


def _refused_everywhere(results, words: tuple[str, ...]) -> None:
    for r in results:
        assert r.returncode == REFUSED, _describe(results)  # exited on its own, refusing, not killed
        assert "REFUSED ShardError" in r.stderr and all(w in r.stderr for w in words), r.stderr[-2000:]
        assert r.seconds < DEADLINE_S / 2


def test_a_cut_inside_a_group_is_refused_on_every_rank_before_the_rendezvous(tmp_path):
    # down_proj's K = 192 over 2 ranks is 96 inputs each: not whole groups of 64.
    write_mlp(tmp_path / "ckpt", FMT, HIDDEN, 192)
    results = _run(tmp_path, 2, CHECK, "--input", "unused")
    _refused_everywhere(results, ("K = 192 over world=2", "whole groups of 64", "world ∈ {1, 3}"))


def test_a_world_that_does_not_divide_is_refused_on_every_rank(tmp_path):
    write_mlp(tmp_path / "ckpt", FMT, HIDDEN, INTER)
    results = _run(tmp_path, 3, CHECK, "--input", "unused")
    _refused_everywhere(results, ("over world=3", "3 does not divide"))


def test_shards_of_mixed_group_sizes_on_one_layer_are_refused_on_every_rank(tmp_path):
    write_mlp(tmp_path / "ckpt", FMT, HIDDEN, INTER)
    write_mlp(tmp_path / "other", GPTQ(bits=4, group_size=128, sym=False), HIDDEN, INTER)
    results = _run(tmp_path, 2, MIXED, "--other", str(tmp_path / "other"))
    _refused_everywhere(results, ("group_size 128 vs 64",))


def test_mlp_layers_chain():
    layers = mlp_layers(FMT, 64, 128)
    dims = {name.rsplit(".", 1)[1]: FMT.validate(t) for name, t in layers.items()}
    assert dims == {"gate_proj": {"K": 64, "N": 128}, "up_proj": {"K": 64, "N": 128}, "down_proj": {"K": 128, "N": 64}}
