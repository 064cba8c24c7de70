"""The all-reduce paths of a tensor-parallel group (quantcore/checkpoint/allreduce.py):
which path a message takes, and the one-shot path's buffers, agreement and refusals,
driven on the CPU through a stand-in for torch's symmetric memory."""

from __future__ import annotations

import pytest
import torch

import quantcore.checkpoint.allreduce as ar
from quantcore.checkpoint.allreduce import (
    ONE_SHOT_MAX_BYTES,
    AllReducer,
    choose_path,
)
from quantcore.checkpoint.parallel import TPGroup
from quantcore.errors import ShardError
from tests.tp.symm_fake import FakeSymm

HIDDEN = 8192
BF16 = torch.bfloat16


def _bytes(rows: int, dtype: torch.dtype = BF16, hidden: int = HIDDEN) -> int:
    return rows * hidden * dtype.itemsize


@pytest.mark.parametrize(("rows", "dtype", "expected"), [
    (1, BF16, "one_shot"),  # 16 KB: decode
    (16, BF16, "one_shot"),  # 256 KB: the threshold itself
    (17, BF16, "backend"),  # one row past it
    (128, BF16, "backend"),  # 2 MB: prefill
    (8, torch.float32, "one_shot"),
    (1, torch.float16, "backend"),  # the one-shot kernel sums bf16 and fp32 only
])
def test_auto_takes_one_shot_for_small_messages_it_can_sum(rows, dtype, expected):
    assert _bytes(16) == ONE_SHOT_MAX_BYTES
    assert choose_path("auto", nbytes=_bytes(rows, dtype), dtype=dtype, unavailable="") == expected


def test_auto_falls_back_where_one_shot_cannot_run_and_forced_one_shot_refuses():
    why = "the tensors are on cpu: the one-shot all-reduce needs CUDA"
    assert choose_path("auto", nbytes=_bytes(1), dtype=BF16, unavailable=why) == "backend"
    assert choose_path("backend", nbytes=_bytes(1), dtype=BF16, unavailable="") == "backend"
    with pytest.raises(ShardError, match="all_reduce_path='one_shot': the tensors are on cpu"):
        choose_path("one_shot", nbytes=_bytes(1), dtype=BF16, unavailable=why)
    with pytest.raises(ShardError, match=r"dtype torch\.float16: the one-shot kernel sums torch\.bfloat16, torch\.float32 only"):
        choose_path("one_shot", nbytes=_bytes(1, torch.float16), dtype=torch.float16, unavailable="")
    # an odd count of bf16 elements is not a multiple of 4 bytes: auto falls back, forced refuses
    assert choose_path("auto", nbytes=2 * 4095, dtype=BF16, unavailable="") == "backend"
    with pytest.raises(ShardError, match="8190 bytes: the one-shot kernel needs a multiple of 4"):
        choose_path("one_shot", nbytes=2 * 4095, dtype=BF16, unavailable="")
    # forced one-shot has no size threshold
    assert choose_path("one_shot", nbytes=_bytes(128), dtype=BF16, unavailable="") == "one_shot"


@pytest.fixture
def reducer(monkeypatch):
    """An AllReducer whose group can run one-shot (as an NCCL group on CUDA would)."""
    monkeypatch.setattr(AllReducer, "_local_unavailable", lambda self, device: "")
    backend_calls: list[torch.Tensor] = []

    def backend(self, t):
        backend_calls.append(t)
        return t.mul_(2)

    monkeypatch.setattr(AllReducer, "_backend", backend)

    def make(path: str = "auto", **fake) -> tuple[AllReducer, FakeSymm, list[torch.Tensor]]:
        symm = FakeSymm(**fake)
        return AllReducer(path, symm=symm), symm, backend_calls

    return make


def _x(rows: int, dtype: torch.dtype = BF16, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_every_rank_takes_the_same_path_for_the_same_message():
    reducers = [AllReducer(p, symm=FakeSymm(world=4)) for p in ("auto", "backend") for _ in range(4)]
    for rows in (1, 3, 16, 17, 128):
        for dtype in (BF16, torch.float16, torch.float32):
            paths = {r.path: set() for r in reducers}
            for r in reducers:
                paths[r.path].add(r.path_for(rows * HIDDEN, dtype, "cpu"))
            assert all(len(p) == 1 for p in paths.values()), (rows, dtype, paths)


def test_one_shot_sums_through_one_buffer_made_once_per_dtype_and_device(reducer):
    red, symm, backend = reducer("auto")
    x1, x16 = _x(1), _x(16, seed=1)
    y1 = red(x1)
    assert y1 is not x1 and torch.equal(y1, x1 * 2)
    assert torch.equal(red(x16), x16 * 2)
    assert len(symm.made) == 1 and symm.made[0].numel() == ONE_SHOT_MAX_BYTES // 2 and symm.agreed == [True]
    assert torch.equal(red(_x(4, torch.float32)), _x(4, torch.float32) * 2)
    assert len(symm.made) == 2 and symm.made[1].dtype == torch.float32  # one per dtype
    x128 = _x(128)
    assert red(x128) is x128 and backend == [x128]  # 2 MB: the backend's path, in place
    assert len(symm.calls) == 3


def test_an_input_off_the_buffers_alignment_is_copied_before_the_one_shot_kernel(reducer):
    red, symm, _ = reducer("one_shot")
    base = _x(2)
    view = base.view(-1)[1:HIDDEN + 1].view(1, HIDDEN)  # starts 2 bytes in
    assert torch.equal(red(view), view * 2)
    assert symm.calls[0][1].data_ptr() != view.data_ptr()
    strided = base.t()  # not contiguous
    assert torch.equal(red(strided), strided * 2)


def test_forced_one_shot_grows_its_buffer_in_eager_and_refuses_to_inside_a_capture(reducer, monkeypatch):
    red, symm, backend = reducer("one_shot")
    big = _x(32)  # 512 KB: past auto's threshold, forced takes it anyway
    assert torch.equal(red(big), big * 2) and symm.made[0].numel() == 32 * HIDDEN
    monkeypatch.setattr(ar, "_capturing", lambda device: True)
    assert torch.equal(red(_x(8)), _x(8) * 2)  # the buffer made holds it: no new buffer needed
    with pytest.raises(ShardError, match=r"cannot be captured in a CUDA graph: call prepare_all_reduce"):
        red(_x(64))
    assert len(symm.made) == 1 and backend == []


def test_prepare_makes_the_buffer_before_a_capture(reducer, monkeypatch):
    red, symm, backend = reducer("auto")
    # the largest message (128 rows) goes to the backend, smaller ones still need the buffer
    assert red.prepare(128 * HIDDEN, BF16, "cpu") == "backend"
    assert len(symm.made) == 1
    monkeypatch.setattr(ar, "_capturing", lambda device: True)
    assert torch.equal(red(_x(16)), _x(16) * 2)
    big = _x(128)
    assert red(big) is big and backend == [big]
    with pytest.raises(ShardError, match="prepare_all_reduce"):
        red(_x(1, torch.float32))  # no fp32 buffer was prepared
    assert len(symm.made) == 1


def test_auto_without_a_prepare_refuses_inside_a_capture(reducer, monkeypatch):
    red, symm, _ = reducer("auto")
    monkeypatch.setattr(ar, "_capturing", lambda device: True)
    with pytest.raises(ShardError, match=r"making one \(a rendezvous of the ranks\) cannot be captured"):
        red(_x(1))
    assert symm.made == []


@pytest.mark.parametrize("fake", [{"peers_ok": False}, {"fail": True}])
def test_when_any_rank_cannot_map_the_buffer_auto_falls_back_for_good(reducer, fake):
    red, symm, backend = reducer("auto", **fake)
    x = _x(1)
    assert red(x) is x and backend == [x]
    assert symm.agreed == [not fake.get("fail", False)]  # this rank said what it saw
    assert red.path_for(x.numel(), BF16, "cpu") == "backend"
    why = red.unavailable(torch.device("cpu"))
    assert ("no peer access" in why) if fake.get("fail") else ("another rank" in why)
    red(_x(2))
    assert len(symm.agreed) == 1  # never tried again: every rank remembers the same refusal


def test_forced_one_shot_refuses_on_every_rank_when_a_rank_cannot_map_the_buffer(reducer):
    red, _, backend = reducer("one_shot", peers_ok=False)
    with pytest.raises(ShardError, match="all_reduce_path='one_shot': symmetric memory failed on another rank"):
        red.prepare(16 * HIDDEN, BF16, "cpu")
    assert backend == []


def test_bad_paths_are_refused_at_construction():
    with pytest.raises(ShardError, match=r"all_reduce_path: expected one of \('backend', 'one_shot', 'auto'\), got 'nccl2'"):
        TPGroup(0, 2, all_reduce_path="nccl2")
    with pytest.raises(ShardError, match="stage_on_host=True all-reduces a host copy"):
        TPGroup(0, 2, stage_on_host=True, all_reduce_path="one_shot")
    auto_host = TPGroup(0, 2, stage_on_host=True, all_reduce_path="auto")
    assert auto_host.all_reduce_path_for(1, HIDDEN, BF16, "cpu") == "backend"
    one = TPGroup(0, 1, all_reduce_path="one_shot")
    x = _x(1)
    assert one.all_reduce(x) is x and one.prepare_all_reduce(16, HIDDEN, BF16, "cpu") == "none"


def test_on_the_cpu_or_a_gloo_group_one_shot_says_why_it_cannot_run(tmp_path):
    import torch.distributed as dist

    red = AllReducer("auto")
    assert "needs CUDA" in red.unavailable(torch.device("cpu"))
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    assert "not initialised" in red.unavailable(torch.device("cuda", 0))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert "backend is gloo: the one-shot path runs on NCCL groups" in red.unavailable(torch.device("cuda", 0))
        assert red.path_for(HIDDEN, BF16, "cuda:0") == "backend"
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="the one-shot all-reduce needs two CUDA devices with peer access")
def test_one_shot_on_two_gpus_matches_the_golden_and_nccl(tmp_path):
    from quantcore.conformance.tp.processes import check_block

    report = check_block(tmp_path, world=2, backend="nccl", device="cuda:rank", all_reduce="one_shot", timeout_s=300)
    if "skipped" in report and not report.get("problems"):
        pytest.skip(report["skipped"])
    assert report["ok"], report
    assert report["all_reduce"] == ["one_shot", "one_shot"] and not report["all_reduce_vs_backend"]["problems"]


def test_a_group_takes_the_auto_path_unless_told_otherwise():
    """``"auto"`` is the default (docs/tensor-parallel.md: the one-shot sum was as fast as
    NCCL's or faster at every M timed); on a CPU it runs the backend's all-reduce."""
    group = TPGroup(0, 2)
    assert group.all_reduce_path == "auto"
    assert group.all_reduce_path_for(1, HIDDEN, BF16, "cpu") == "backend"
    assert TPGroup(0, 2, all_reduce_path="backend").all_reduce_path == "backend"
