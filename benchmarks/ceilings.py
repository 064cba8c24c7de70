"""The device's ceilings, measured, not read off a datasheet: copy bandwidth (bytes read
plus bytes written, one large device-to-device copy) and a large bf16 matmul (on a CPU, a
square of at most 2048 sized to the CPU: a CPU without bf16 arithmetic takes about a minute
for 2048³). Measured
once per device and software stack, cached in ``ceilings.json`` of quantcore's cache
folder (``$QUANTCORE_CACHE``, default ``~/.cache/quantcore``)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from quantcore.errors import InvalidArgumentError
from quantcore.files import read_json
from quantcore.measured import cache_dir
from quantcore.probe import probe
from quantcore.timing import time_interleaved

__all__ = ["Ceilings", "ceilings"]


def cache_file() -> Path:
    return cache_dir() / "ceilings.json"


@dataclass(frozen=True)
class Ceilings:
    device_name: str
    copy_bytes_per_s: float
    matmul_flops_per_s: float
    matmul_what: str


def _key(device: str) -> str:
    caps = probe(device)
    return f"{caps.device_type}|{caps.name}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def measure(device: str) -> Ceilings:
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    nbytes = (1 << 30) if cuda else (256 << 20)
    src = torch.randn(nbytes // 4, device=dev)
    dst = torch.empty_like(src)
    n = 8192 if cuda else _cpu_matmul_size()
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    copy, mm = time_interleaved([lambda i: dst.copy_(src), lambda i: a @ b], device, rounds=5)
    return Ceilings(
        device_name=probe(device).name,
        copy_bytes_per_s=2 * nbytes / copy.median_s,
        matmul_flops_per_s=2 * n**3 / mm.median_s,
        matmul_what=f"bf16 {n}x{n}x{n} torch.matmul",
    )


def _cpu_matmul_size(limit_s: float = 0.05, largest: int = 2048) -> int:
    """The matmul side for a CPU: doubled from 256 while the next size's product takes at
    most ``limit_s``, up to ``largest``."""
    n = 256
    while n < largest:
        a = torch.randn(2 * n, 2 * n, dtype=torch.bfloat16)
        t0 = time.perf_counter()
        a @ a
        if time.perf_counter() - t0 > limit_s:
            break
        n *= 2
    return n


def ceilings(device: str, *, remeasure: bool = False) -> Ceilings:
    key = _key(device)
    cache: dict[str, dict[str, object]] = {}
    path = cache_file()
    if path.exists():
        try:
            found = read_json(path, limit=1 << 20, error=InvalidArgumentError)
            cache = found if isinstance(found, dict) else {}
        except InvalidArgumentError:  # not a cache this wrote: measured again, and rewritten
            cache = {}
    if not isinstance(cache.get(key), dict):
        cache.pop(key, None)
    if not remeasure and key in cache:
        try:
            return Ceilings(**cache[key])  # type: ignore[arg-type]
        except TypeError:  # an entry of another version: measured again
            pass
    result = measure(device)
    cache[key] = asdict(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cache, indent=1))
    return result
