"""Every transform is deterministic: the same input gives a bit-identical result (every
tensor of a prepared state: bytes, dtype and shape), run twice in one process, in two
processes with different hash seeds and thread counts, and on CPU and CUDA where a
transform runs on both (skipped without CUDA; on an H100:
``python -m pytest tests/hardening/test_determinism.py -k cuda``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from quantcore.backends.trtllm_moe.preprocess import CutlassMixedGemmLayout, QuantType
from quantcore.errors import QuantCoreError
from quantcore.registry import KernelEntry

from .determinism_digest import digests
from .fuzz.seeds import make_kernel, runnable_kernels, seed_tensors, seeds_for
from .fuzz.state import differences
from .fuzz.transforms import FormatTransform, format_transforms

REPO = Path(__file__).resolve().parents[2]
#: Seeds per format in these tests (evenly spread over the format's parameterisations).
PER_FORMAT = 12


def sample(cases: tuple[Any, ...], n: int = PER_FORMAT) -> tuple[Any, ...]:
    step = max(1, -(-len(cases) // n))
    return cases[::step]
KERNELS = [e for e in runnable_kernels("cpu") if seeds_for(e.cls.format, e.cls.op)]
TRANSFORMS = format_transforms()
CUDA = torch.cuda.is_available()


def _clone(tensors: dict[str, torch.Tensor], device: str = "cpu") -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().to(device) for k, v in tensors.items()}


def _prepare(entry: KernelEntry, case: Any, device: str = "cpu") -> Any:
    try:
        return make_kernel(entry, case.format, device).prepare(_clone(seed_tensors(case), device))
    except QuantCoreError as exc:
        return f"refused: {type(exc).__name__}: {exc}"


@pytest.mark.parametrize("entry", KERNELS, ids=lambda e: f"{e.cls.format}/{e.cls.name}")
def test_prepare_is_deterministic(entry: KernelEntry) -> None:
    """Every seed of the kernel's format, prepared twice from fresh copies."""
    for case in sample(seeds_for(entry.cls.format, entry.cls.op)):
        diff = differences(_prepare(entry, case), _prepare(entry, case))
        assert not diff, f"{entry.cls.name} on {case.id}: {diff}"


def _apply(ft: FormatTransform, case: Any, flags: dict[str, bool], device: str = "cpu") -> Any:
    try:
        return ft.build(case.format, **flags).apply(_clone(seed_tensors(case), device))
    except QuantCoreError as exc:
        return f"refused: {type(exc).__name__}: {exc}"


def _flag_sets(ft: FormatTransform) -> list[dict[str, bool]]:
    return [dict.fromkeys(ft.flags, v) for v in (False, True)] if ft.flags else [{}]


@pytest.mark.parametrize("ft", TRANSFORMS, ids=lambda ft: ft.name)
def test_transform_is_deterministic(ft: FormatTransform) -> None:
    for case in sample(seeds_for(ft.format_cls.name)):
        for flags in _flag_sets(ft):
            diff = differences(_apply(ft, case, flags), _apply(ft, case, flags))
            assert not diff, f"{ft.name} {flags} on {case.id}: {diff}"


CUTLASS = [(qt, arch) for qt in QuantType for arch in (70, 75, 80, 86, 89, 90)]


def _cutlass_weight(qt: QuantType) -> torch.Tensor:
    gen = torch.Generator().manual_seed(11)
    return torch.randint(-128, 128, (2, 128, 64 * qt.bits // 8), dtype=torch.int8, generator=gen)


@pytest.mark.parametrize(("qt", "arch"), CUTLASS, ids=[f"{q.value}-sm{a}" for q, a in CUTLASS])
def test_cutlass_preprocessor_is_deterministic(qt: QuantType, arch: int) -> None:
    w = _cutlass_weight(qt)
    layout = CutlassMixedGemmLayout(qt, arch)
    assert not differences(layout.apply(w.clone()), layout.apply(w.clone()))


def test_golden_quantizers_are_deterministic() -> None:
    """Same weight, same generator seed: the same checkpoint (rotations and act-order
    permutations are drawn from the generator, nothing else)."""
    import inspect

    names = sorted({c.format.name for c in _all_seeds()})
    for case in [c for name in names for c in sample(seeds_for(name), 4)]:
        fmt = case.format
        if list(inspect.signature(fmt.quantize).parameters)[:1] != ["weight"]:
            continue
        dense = fmt.dequantize(seed_tensors(case), dtype=torch.float32)
        a = fmt.quantize(dense.clone(), generator=torch.Generator().manual_seed(5))
        b = fmt.quantize(dense.clone(), generator=torch.Generator().manual_seed(5))
        assert not differences(a, b), case.id


def _all_seeds() -> list[Any]:
    from .fuzz.seeds import seed_cases

    return list(seed_cases())


def _digest_process(hash_seed: str, threads: str) -> subprocess.Popen[str]:
    # The child samples the kernels this process can run on the CPU: Triton's ones only
    # with the interpreter, which a CUDA run (--qc-device cuda) leaves off.
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "QUANTCORE_DIGEST_THREADS": threads, "OMP_NUM_THREADS": threads,
           "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "0"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "tests.hardening.determinism_digest"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_same_digests_across_processes() -> None:
    """Two fresh processes (hash seeds 1 and 2, 1 and 2 threads) and this one agree on
    every prepared state and transform output of the sample."""
    here = digests()
    results = []
    for hash_seed, threads in (("1", "1"), ("2", "2")):  # one at a time: they share the CI's cores
        p = _digest_process(hash_seed, threads)
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out))
    assert len(here) > 50
    for other in results:
        assert other.keys() == here.keys(), (
            f"sampled different cases: only here {sorted(here.keys() - other.keys())[:8]}, "
            f"only in the child {sorted(other.keys() - here.keys())[:8]}"
        )
        differ = sorted(k for k in here if here[k] != other[k])
        assert not differ, f"differ between processes: {differ}"


# --- CPU vs CUDA, where both run the transform ----------------------------------------------

BOTH = [e for e in KERNELS if {"cpu", "cuda"} <= e.cls.requires.device_types]
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("entry", BOTH, ids=lambda e: f"{e.cls.format}/{e.cls.name}")
def test_cuda_prepare_matches_cpu(entry: KernelEntry) -> None:
    """``prepare`` on CUDA makes the same bytes as on CPU (``dtype=None``: compute dtypes
    that differ by device by design stay out)."""
    for case in sample(seeds_for(entry.cls.format, entry.cls.op)):
        cpu, cuda = _prepare(entry, case, "cpu"), _prepare(entry, case, "cuda")
        if isinstance(cpu, str) or isinstance(cuda, str):
            assert isinstance(cpu, str) == isinstance(cuda, str), f"{case.id}: {cpu!r:.200} vs {cuda!r:.200}"
            continue
        diff = differences(cpu, cuda)
        assert not diff, f"{entry.cls.name} on {case.id}: {diff}"


@needs_cuda
@pytest.mark.parametrize("ft", TRANSFORMS, ids=lambda ft: ft.name)
def test_cuda_transform_matches_cpu(ft: FormatTransform) -> None:
    for case in sample(seeds_for(ft.format_cls.name)):
        for flags in _flag_sets(ft):
            cpu, cuda = _apply(ft, case, flags, "cpu"), _apply(ft, case, flags, "cuda")
            if isinstance(cpu, str) or isinstance(cuda, str):
                continue  # device-specific (tinygemm is CUDA-only): nothing to compare
            diff = differences(cpu, cuda)
            assert not diff, f"{ft.name} {flags} on {case.id}: {diff}"


@needs_cuda
@pytest.mark.parametrize(("qt", "arch"), CUTLASS, ids=[f"{q.value}-sm{a}" for q, a in CUTLASS])
def test_cuda_cutlass_preprocessor_matches_cpu(qt: QuantType, arch: int) -> None:
    w = _cutlass_weight(qt)
    layout = CutlassMixedGemmLayout(qt, arch)
    assert not differences(layout.apply(w), layout.apply(w.cuda()))
