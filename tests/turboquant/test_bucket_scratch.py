"""A TurboQuant Triton bucket looks its kept scratch up once per stream and M
(backends/turboquant_triton/fused.py, ``_Bucket.scratch``), never remembering what a graph
being captured was handed."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from quantcore.backends.turboquant_triton import fused


def test_a_bucket_looks_its_scratch_up_once_per_stream_and_m(monkeypatch):
    made: list[int] = []

    def make() -> tuple[torch.Tensor, ...]:
        made.append(1)
        return (torch.randn(4),)

    bucket = SimpleNamespace(device=torch.device("cpu"), _scratch={})
    first = fused._Bucket.scratch(bucket, 16, make)
    assert fused._Bucket.scratch(bucket, 16, make) is first and len(made) == 1
    assert fused._Bucket.scratch(bucket, 32, make) is not first and len(made) == 2
    monkeypatch.setattr(fused, "stream_key", lambda device: ("cpu", 7))  # another stream
    fused._Bucket.scratch(bucket, 16, make)
    assert len(made) == 3
    monkeypatch.setattr(fused, "capturing", lambda device: True)
    fused._Bucket.scratch(bucket, 64, make)
    fused._Bucket.scratch(bucket, 64, make)
    assert len(made) == 5, "what a capture is handed may be that graph's alone: never remembered"
