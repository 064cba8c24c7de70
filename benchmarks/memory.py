"""How many rotating input sets a benchmark needs so the cache is not what is measured."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["cache_bytes", "rotation_sets"]


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
