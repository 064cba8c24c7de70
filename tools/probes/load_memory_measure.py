"""The measured half of ``load_memory.py``: one ``quantcore.load_quantized`` of a
checkpoint folder in a fresh process, with its host memory sampled (what is measured and
why: the docstring of ``load_memory.py``).

    python -m tools.probes.load_memory_measure CHECKPOINT --warmup WARMUP --device cuda --json PATH
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch
import transformers

import quantcore
from quantcore.checkpoint import load as load_module

#: The lines of /proc/self/status read (kB there; bytes here).
FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
INTERVAL_S = 0.005


def status() -> dict[str, int]:
    """This process's memory now, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in FIELDS:
                out[key] = int(value.split()[0]) * 1024
    return out


class Sampler(threading.Thread):
    """Reads /proc/self/status every 5 ms until stopped; keeps every sample."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append((time.perf_counter(), status()))
            self.done.wait(INTERVAL_S)
        self.samples.append((time.perf_counter(), status()))

    def stop(self) -> None:
        self.done.set()
        self.join()

    def peak(self, key: str, start: float = float("-inf"), end: float = float("inf")) -> int | None:
        """The largest sample of ``key`` from ``start`` to the first sample after ``end``
        (which saw what the span left behind); None when no sample covers the span."""
        values = [s[key] for t, s in self.samples if start <= t <= end]
        after = next((s[key] for t, s in self.samples if t > end), None)
        values += [after] if after is not None else []
        return max(values) if values else None


class LayerSpan:
    """When ``load_quantized`` started its first quantized layer and finished its last:
    timestamps only, taken by wrapping the loader's per-layer step (``_quant_linear``)."""

    STEP = "_quant_linear"

    def __init__(self) -> None:
        self.times: list[float] = []

    @contextmanager
    def watch(self) -> Iterator[None]:
        original = getattr(load_module, self.STEP, None)
        if original is None:  # the loader changed: no phases, the whole load is still measured
            yield
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.times.append(time.perf_counter())
            result = original(*args, **kwargs)
            self.times.append(time.perf_counter())
            return result

        setattr(load_module, self.STEP, timed)
        try:
            yield
        finally:
            setattr(load_module, self.STEP, original)

    def phases(self, start: float, end: float) -> dict[str, tuple[float, float]]:
        """Before the first layer (config, shards, checks), the layers, after them (dense
        tensors, the move to the device)."""
        if not self.times:
            return {}
        return {"before_layers": (start, self.times[0]), "layers": (self.times[0], self.times[-1]),
                "after_layers": (self.times[-1], end)}


def reset_peak() -> bool:
    """Reset VmHWM (and so ``ru_maxrss``) to the current RSS (Linux: clear_refs 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def trim() -> None:
    """Hand freed heap back to the kernel, so the baseline counts only live memory."""
    gc.collect()
    with suppress(OSError, AttributeError):  # not glibc: the baseline may include freed heap
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def skeleton(folder: Path) -> torch.nn.Module:
    """The model ``folder``'s config.json describes, on meta but for its rotary
    frequencies (computed at init, never saved)."""
    config = transformers.AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is not None:
        model.model.rotary_emb = type(rotary)(config=config)
    return model.eval()


def load(folder: Path, device: torch.device) -> torch.nn.Module:
    model = quantcore.load_quantized(skeleton(folder), folder, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return model


def layer_types(model: torch.nn.Module, config: dict[str, Any]) -> dict[str, Any]:
    """What each planned quantized linear became, and the kernels bound."""
    from tools.probes.load_memory_checkpoint import LINEARS

    names = [f"model.layers.{i}.{n}" for i in range(config["num_hidden_layers"]) for n in LINEARS]
    modules = dict(model.named_modules())
    types = Counter(type(modules.get(n)).__name__ for n in names)
    kernels = Counter(modules[n].kernel.name for n in names if hasattr(modules.get(n), "kernel"))
    return {"expected": len(names), "quantized": types.get("QuantLinear", 0), "types": dict(types),
            "kernels": dict(kernels)}


def measure(folder: Path, warmup: Path | None, device: torch.device) -> dict[str, Any]:
    steps = {"imports": status()}
    if device.type == "cuda":
        torch.ones(1, device=device)
        torch.cuda.synchronize(device)
    steps["device_init"] = status()
    if warmup is not None:
        print("warm-up: one layer of the same shapes and format", flush=True)
        load(warmup, device)  # dropped at once: only what stays loaded (modules, kernels) counts
        if device.type == "cuda":
            torch.cuda.empty_cache()
    model_skeleton = skeleton(folder)
    trim()
    hwm_reset = reset_peak()
    steps["baseline"] = status()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    print(f"loading {folder.name} on {device}", flush=True)
    span, sampler = LayerSpan(), Sampler()
    sampler.start()
    start = time.perf_counter()
    with span.watch():
        model = quantcore.load_quantized(model_skeleton, folder, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    end = time.perf_counter()
    sampler.stop()
    steps["after_load"] = status()
    config = json.loads((folder / "config.json").read_text())
    result: dict[str, Any] = {
        "steps": steps,
        "wall_s": end - start,
        "peaks": {key: sampler.peak(key) for key in ("VmRSS", "RssAnon", "RssFile")},
        "vmhwm": steps["after_load"]["VmHWM"],
        "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_reset_at_baseline": hwm_reset,
        "phases": {
            phase: {"start_s": a - start, "end_s": b - start, "peak_anon": sampler.peak("RssAnon", a, b),
                    "peak_file": sampler.peak("RssFile", a, b), "peak_rss": sampler.peak("VmRSS", a, b)}
            for phase, (a, b) in span.phases(start, end).items()
        },
        "samples": len(sampler.samples),
        "timeline_columns": ["s", "RssAnon", "RssFile"],
        "timeline": [(round(t - start, 4), s["RssAnon"], s["RssFile"])
                     for t, s in sampler.samples[:: max(1, len(sampler.samples) // 400)]],
        "layers": layer_types(model, config),
    }
    if device.type == "cuda":
        result["gpu"] = {"allocated": torch.cuda.memory_allocated(device),
                         "max_allocated": torch.cuda.max_memory_allocated(device),
                         "name": torch.cuda.get_device_name(device)}
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--warmup", type=Path, default=None, help="a checkpoint loaded first, not measured")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    result = measure(args.checkpoint, args.warmup, torch.device(args.device))
    args.json.write_text(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
