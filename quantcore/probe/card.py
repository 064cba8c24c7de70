"""What a GPU is, as far as the best plan of a kernel depends on it: a key for tuned tables.

A table keyed by a marketing name ("NVIDIA H100 80GB HBM3") misses every other card of
the same chip — an H200, an H100 NVL, a cloud's renamed part — although their plans
differ only where the architecture, the number of SMs, the shared memory a block may
take or the memory bandwidth differ. :class:`CardKey` holds exactly those, read from the
driver's device properties; :meth:`CardKey.nearest` finds the closest keyed table for a
card nobody has tuned on.

The bandwidth class is the nominal DRAM bandwidth in whole TB/s (memory clock × bus
width × 2 transfers per clock), which separates an H100 SXM (3.35 TB/s, class 3) from an
H200 (4.8 TB/s, class 4) and an H100 PCIe (2.0 TB/s, class 2); 0 when the driver does not
say (older torch builds lack the two fields).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["CardKey", "card_key", "key_of_properties"]


@dataclass(frozen=True, order=True)
class CardKey:
    """The properties a tuned plan depends on."""

    arch: str  # "sm_90"
    sms: int
    smem_kib: int  # shared memory one block may opt in to, KiB
    bandwidth_class: int  # nominal DRAM bandwidth, whole TB/s; 0 when unknown

    @property
    def slug(self) -> str:
        bw = f"{self.bandwidth_class}tbps" if self.bandwidth_class else "bw-unknown"
        return f"{self.arch}-{self.sms}sm-{self.smem_kib}k-{bw}"

    def nearest(self, keys: Iterable[CardKey]) -> CardKey | None:
        """The key of the same architecture closest to this one: the same bandwidth
        class first (unknown counts as any), then the nearest SM count; None if no key
        shares the architecture."""
        same = [k for k in keys if k.arch == self.arch]
        if not same:
            return None

        def distance(k: CardKey) -> tuple[int, int, int]:
            bw = 0 if not self.bandwidth_class else abs(k.bandwidth_class - self.bandwidth_class)
            return bw, abs(k.sms - self.sms), abs(k.smem_kib - self.smem_kib)

        return min(same, key=distance)


def key_of_properties(props: Any) -> CardKey:
    """The key of a ``torch.cuda.get_device_properties`` result (or anything with its
    fields: ``major``, ``minor``, ``multi_processor_count``, ``shared_memory_per_block_optin``,
    and where present ``memory_clock_rate`` in kHz and ``memory_bus_width`` in bits)."""
    smem = getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    bandwidth = 2 * clock_khz * 1e3 * bus_bits / 8
    return CardKey(
        arch=f"sm_{props.major}{props.minor}",
        sms=int(props.multi_processor_count),
        smem_kib=int(smem) // 1024,
        bandwidth_class=int(bandwidth / 1e12),
    )


def card_key(device: Any = None) -> CardKey:
    """The key of a CUDA device (``torch.device``, index, or None for the current one)."""
    import torch

    return key_of_properties(torch.cuda.get_device_properties(device))
