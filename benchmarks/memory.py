"""How many rotating input sets a benchmark needs so the cache is not what is measured, and
how a quantized weight is copied into such sets."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["cache_bytes", "rotation_sets", "with_fresh_codes"]


def cache_bytes(device: str) -> int:
    """The last-level cache: L2 on a GPU, L3 (or the largest level) on a CPU."""
    if device.startswith("cuda"):
        return int(getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 50 << 20))
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=64 << 20)


def rotation_sets(bytes_per_set: int, device: str, *, cap: int = 8) -> int:
    """Enough sets that together they are at least twice the cache, at most ``cap``."""
    need = -(-2 * cache_bytes(device) // max(bytes_per_set, 1))
    return int(max(1, min(cap, need)))


def with_fresh_codes(base: dict[str, torch.Tensor], sets: int, gen: torch.Generator,
                     name: str = "qweight") -> list[dict[str, torch.Tensor]]:
    """``base`` and ``sets − 1`` copies of it whose int32 ``name`` holds fresh random words:
    the same scales and metadata, distinct memory, the same work."""
    out = [base]
    for _ in range(sets - 1):
        t = dict(base)
        t[name] = torch.randint(-(2**31), 2**31 - 1, base[name].shape, generator=gen, dtype=torch.int32)
        out.append(t)
    return out
