"""Digests of prepared states and transform outputs, one JSON line per process.

``python -m tests.hardening.determinism_digest`` prints ``{case: sha256}`` for a fixed
sample: every kernel that runs on this machine's CPU on the first seeds of its format,
every format transform on the first seeds of its format, and the TensorRT-LLM
preprocessor. ``test_determinism`` runs it in two processes with different hash seeds and
thread counts and compares both with the same digests made in the test's own process.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["SEEDS_PER_FORMAT", "digests", "states"]

#: Seeds per format in the sample (seeds are sorted by slug).
SEEDS_PER_FORMAT = 4


def states() -> Iterator[tuple[str, Any]]:
    """``(key, state)`` for the sample, made from scratch (seed weights included)."""
    import torch

    from quantcore.backends.trtllm_moe.preprocess import CutlassMixedGemmLayout, QuantType
    from quantcore.errors import QuantCoreError

    from .fuzz.seeds import make_kernel, runnable_kernels, seed_tensors, seeds_for
    from .fuzz.transforms import format_transforms

    for entry in runnable_kernels("cpu"):
        for case in seeds_for(entry.cls.format, entry.cls.op)[:SEEDS_PER_FORMAT]:
            try:
                state = make_kernel(entry, case.format, "cpu").prepare(seed_tensors(case))
            except QuantCoreError as exc:
                state = f"refused: {type(exc).__name__}"
            yield f"prepare/{entry.cls.name}/{case.id}", state
    for ft in format_transforms():
        for case in seeds_for(ft.format_cls.name)[:SEEDS_PER_FORMAT]:
            for flag in (False, True) if ft.flags else (None,):
                flags = dict.fromkeys(ft.flags, flag) if ft.flags else {}
                try:
                    state = ft.build(case.format, **flags).apply(seed_tensors(case))
                except QuantCoreError as exc:
                    state = f"refused: {type(exc).__name__}"
                yield f"transform/{ft.name}/{case.id}/{flags}", state
    gen = torch.Generator().manual_seed(0)
    for qt in QuantType:
        w = torch.randint(-128, 128, (2, 128, 64 * qt.bits // 8), dtype=torch.int8, generator=gen)
        for arch in (70, 75, 80, 89, 90):
            yield f"transform/cutlass/{qt.value}/sm{arch}", CutlassMixedGemmLayout(qt, arch).apply(w)


def digests() -> dict[str, str]:
    from .fuzz.state import digest

    return {key: digest(state) for key, state in states()}


def main() -> int:
    threads = os.environ.get("QUANTCORE_DIGEST_THREADS")
    from quantcore.conformance.interpreter import enable_interpreter_for

    enable_interpreter_for("cpu")
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    json.dump(digests(), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
