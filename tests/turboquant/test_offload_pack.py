"""The offload pool's per-layer cost: a pass-2 is one packed host buffer (one copy per
layer), and the views that read a slot are made once per (slot, layer) and reused."""

from __future__ import annotations

import torch

from quantcore.kernels.turboquant.rotation import InputRotation
from quantcore.nn.turboquant.offload import OffloadedPass, Pass2OffloadPool
from quantcore.tensors import version_of
from quantcore.transforms.turboquant_passes import PassData


def _pass(seed: int, n: int = 24, k: int = 64) -> PassData:
    gen = torch.Generator().manual_seed(seed)
    return PassData(
        indices=torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen),
        scales=torch.rand(n, k // 32, generator=gen),
        rotation=torch.randn(1, 32, 32, generator=gen).to(torch.bfloat16),
    )


def test_a_pass_is_packed_into_one_aligned_buffer_with_the_same_bytes() -> None:
    data = _pass(0)
    entry = OffloadedPass(data, name="layer")
    assert entry.flat.dtype == torch.uint8 and entry.flat.dim() == 1
    for f in entry.fields:
        assert f.offset % 256 == 0, f  # 16-byte vector loads stay aligned in a slot
    for name, t in data.tensors().items():
        view = getattr(entry.host, name)
        assert view.dtype == t.dtype and view.shape == t.shape
        assert torch.equal(view, t)
        assert view.untyped_storage().data_ptr() == entry.flat.untyped_storage().data_ptr()


def test_slot_views_are_made_once_and_hold_the_layer_bytes() -> None:
    pool = Pass2OffloadPool()
    entries = [OffloadedPass(_pass(i, n=24 + 8 * i), name=f"l{i}") for i in range(3)]
    for e in entries:
        pool.register(e, torch.device("cpu"))
    seen: dict[str, PassData] = {}
    for _step in range(3):
        for e in entries:
            slot = pool.begin(e)
            data = pool.wait(slot, e)
            for name, t in e.host.tensors().items():
                assert torch.equal(getattr(data, name), t), (e.name, name)
            key = f"{e.name}@{id(slot)}"
            if key in seen:
                assert data is seen[key]  # cached, not rebuilt per call
            seen[key] = data
    # one copy per layer and step once the chain is warm (3 layers, 2 slots: every layer reloads)
    assert pool.copies >= 9


def test_a_reload_leaves_the_views_versions_so_what_a_kernel_kept_stays_current() -> None:
    """Three layers over two slots reload at every step. A reload writes the same bytes,
    so the views' version counters must not move: a kernel keeps the rotations' GEMM
    operand (``InputRotation``) while they hold, and would make it again at every call."""
    pool = Pass2OffloadPool()
    entries = [OffloadedPass(_pass(i), name=f"l{i}") for i in range(3)]
    for e in entries:
        pool.register(e, torch.device("cpu"))
    kept: dict[str, tuple[InputRotation, int]] = {}
    for _step in range(3):
        for e in entries:
            data = pool.wait(pool.begin(e), e)
            assert torch.equal(data.rotation, e.host.rotation)
            key = f"{e.name}@{data.rotation.data_ptr()}"
            if key in kept:
                rotation, version = kept[key]
                assert version_of(data.rotation) == version and rotation.current(), e.name
            else:
                kept[key] = (InputRotation([data.rotation, e.host.rotation]), version_of(data.rotation))
    assert pool.copies >= 9  # every step reloaded every layer: the versions held through copies
