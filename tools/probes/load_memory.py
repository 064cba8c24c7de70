"""How much host memory does loading a 7B-class quantized checkpoint onto a GPU take, set
against one decoder layer's tensors? (a developer's probe; CUDA, or ``--device cpu``)

    python -m tools.probes.load_memory --out DIR [--device cuda] [--format gptq4|awq4|ct4]
        [--layers 32 --hidden 4096 --intermediate 11008 --vocab 32000] [--checkpoint DIR] [--keep]

1. Writes a Llama-2-7B-shaped checkpoint folder (GPTQ 4-bit, group 128 by default) of
   random codes, scales and zero points, streamed one decoder layer at a time, in shards
   of at most ``--shard-gb`` (``load_memory_checkpoint.py``), and a one-layer checkpoint of
   the same shapes for the warm-up. Both go to ``--checkpoint`` (default: a temporary
   folder, removed at the end unless ``--keep``), not to ``--out``.
2. In a fresh process (the writer's memory is not counted; ``load_memory_measure.py``):
   imports torch, quantcore and transformers, initialises the device, loads the warm-up
   checkpoint and drops it, builds the model on meta from the checkpoint's config.json,
   frees what is freed (``malloc_trim``), takes the baseline, then times one
   ``quantcore.load_quantized(skeleton, folder, device=...)`` while a thread reads
   ``/proc/self/status`` every 5 ms.
3. Writes ``DIR/load_memory-<device>.json``: every number below and a one-line verdict.

What is measured. ``VmRSS`` (and its peak ``VmHWM``, which is ``ru_maxrss``) counts every
resident page mapped into the process, and safetensors maps each shard with ``mmap``: a
tensor read from a shard is a view of the mapped file (safetensors >= 0.6 hands out such
views without copying), and every page of it that is read — to copy it to the GPU or
prepare it — stays resident and counted in ``RssFile`` until the shard is closed at the
end of the load, while pages never read never count. So a lazy loader's ``VmRSS`` still
climbs by the whole checkpoint (clean page cache the kernel may drop at will, not memory
the process holds). The memory the process holds is ``RssAnon`` (heap, copies,
conversions, pinned staging); the probe reports the peak of each separately: the verdict
judges ``RssAnon`` above the baseline, over the whole load and while quantized layers are
read (timestamps from the loader's per-layer step, see ``LayerSpan``), against the bytes of one
decoder layer's quantized tensors and of the largest tensor (the bfloat16 embeddings and
``lm_head``, read whole, reported apart: the claim is about quantized layers).

The baseline is taken after a warm-up load because the first layer of a kind imports
kernel modules and loads device code once per process; the numbers after imports and
device initialisation alone are in the JSON too (``steps``). The 5 ms samples miss spikes
shorter than that (``VmHWM`` does not, for ``VmRSS``). The checkpoint was just written,
so its pages are in the page cache: the wall time is a warm read.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from quantcore.measured import device_slug
from tools.probes.load_memory_checkpoint import FORMATS, Llama, Written, write_checkpoint

ROOT = Path(__file__).resolve().parents[2]
MB = 1e6


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def checkpoint_sizes(written: Written) -> dict[str, Any]:
    dense = max(written.dense.items(), key=lambda kv: kv[1]) if written.dense else ("", 0)
    return {
        "files": written.files,
        "total_bytes": written.total_bytes,
        "layer_bytes": written.layer_bytes,
        "largest_quantized_tensor": {"name": written.largest_quantized[0], "bytes": written.largest_quantized[1]},
        "largest_tensor": {"name": dense[0], "bytes": dense[1]} if dense[1] > written.largest_quantized[1]
        else {"name": written.largest_quantized[0], "bytes": written.largest_quantized[1]},
        "dense_tensors": written.dense,
    }


def verdict(sizes: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """Peak anonymous memory over the baseline against one layer and the largest tensor."""
    base = measured["steps"]["baseline"]
    layer, largest = sizes["layer_bytes"], sizes["largest_tensor"]
    held = measured["peaks"]["RssAnon"] - base["RssAnon"]
    phase = measured["phases"].get("layers")
    held_layers = phase["peak_anon"] - base["RssAnon"] if phase and phase["peak_anon"] is not None else None
    # VmHWM is exact where it was reset at the baseline; the samples are the fallback.
    peak_rss = measured["vmhwm"] if measured["peak_reset_at_baseline"] else measured["peaks"]["VmRSS"]
    mapped = peak_rss - base["VmRSS"]
    judged = held_layers if held_layers is not None else held
    during = (f"{held_layers / MB:.0f} MB ({held_layers / layer:.2f}x) while the quantized layers were read; "
              if held_layers is not None else "")
    line = (
        f"{'BELOW' if judged < layer else 'ABOVE'} one layer: peak anonymous RSS - baseline = "
        f"{held / MB:.0f} MB over the whole load, {held / layer:.2f}x one decoder layer's quantized tensors "
        f"({layer / MB:.1f} MB) and {held / largest['bytes']:.2f}x the largest tensor ({largest['name']}, "
        f"{largest['bytes'] / MB:.0f} MB); {during}peak RSS - baseline = {mapped / MB:.0f} MB, counting the pages "
        f"of the {sizes['total_bytes'] / MB:.0f} MB checkpoint read through mmap"
    )
    return {
        "line": line,
        "held_bytes": held,
        "held_while_layers_bytes": held_layers,
        "rss_with_mapped_pages_bytes": mapped,
        "below_one_layer_while_layers": held_layers is not None and held_layers < layer,
        "below_one_layer_whole_load": held < layer,
        "below_largest_tensor_whole_load": held < largest["bytes"],
    }


def run_child(folder: Path, warmup: Path, device: str, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tools.probes.load_memory_measure", str(folder), "--warmup", str(warmup),
           "--device", device, "--json", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where load_memory-<device>.json goes")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--format", choices=sorted(FORMATS), default="gptq4")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=11008)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shard-gb", type=float, default=2.0,
                        help="shard size limit (a 7B checkpoint at 4 bits is about 3.9 GB: 2 GB gives two shards "
                             "and an index, as the published ones have)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=Path, default=None, help="where the checkpoints are written "
                        "(default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints")
    args = parser.parse_args(argv)

    root = args.checkpoint or Path(tempfile.mkdtemp(prefix="load-memory-"))
    model = Llama(args.layers, args.hidden, args.intermediate, args.vocab)
    try:
        start = time.perf_counter()
        folder = root / f"{args.format}-{args.layers}L-{args.hidden}h"
        print(f"writing {folder}", flush=True)
        written = write_checkpoint(folder, args.format, model, seed=args.seed, shard_bytes=int(args.shard_gb * 1e9),
                                   progress=lambda line: print(f"  {time.perf_counter() - start:6.1f} s  {line}",
                                                               flush=True))
        warmup = write_checkpoint(root / "warmup", args.format, Llama(1, args.hidden, args.intermediate, 128),
                                  seed=args.seed + 1).folder
        write_s = time.perf_counter() - start
        print(f"wrote {written.total_bytes / MB:.0f} MB in {len(written.files)} file(s) in {write_s:.1f} s", flush=True)
        measured = run_child(folder, warmup, args.device, root / "measured.json")
    finally:
        if not args.keep and args.checkpoint is None:
            shutil.rmtree(root, ignore_errors=True)
    sizes = checkpoint_sizes(written)
    judged = verdict(sizes, measured)
    name = measured.get("gpu", {}).get("name", args.device)
    result = {
        "question": "peak host memory of load_quantized on a 7B-class checkpoint, against one layer's tensors",
        "device": args.device, "device_name": name, "format": args.format, "format_slug": FORMATS[args.format].slug,
        "model": vars(model), "seed": args.seed, "write_s": write_s,
        "versions": {p: _version(p) for p in ("torch", "quantcore", "transformers", "safetensors", "triton")},
        "checkpoint": sizes, "measured": measured, "verdict": judged["line"], "judged": judged,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"load_memory-{device_slug(name)}.json"
    path.write_text(json.dumps(result, indent=1))
    layers = measured["layers"]
    print(f"loaded in {measured['wall_s']:.1f} s: {layers['quantized']}/{layers['expected']} QuantLinear "
          f"({', '.join(f'{k} x{v}' for k, v in layers['kernels'].items())})")
    print(judged["line"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
