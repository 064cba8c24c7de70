"""One session per hardware target, plus lint.

    nox -s cpu     # fresh venv: CPU torch + triton (interpreter), the matrix and the tests
    nox -s cuda    # on a CUDA machine, in the environment already there (works offline);
                   # nox -s cuda -- conformance | tests | fuzz | bench [SUITE ...] runs one part
    nox -s xpu     # likewise on an Intel XPU machine
    nox -s npu     # likewise on an Ascend NPU machine (torch_npu, triton-ascend)
    nox -s lint    # ruff, mypy and the layers contract (imports only point down, no cycles)
    nox -s fuzz    # the hardening suites in the nightly fuzz profile (> 10,000 cases), with counts

The device sessions run in the current interpreter (``python=False``) and install
quantcore with ``pip install --no-deps --no-build-isolation -e .``: accelerator machines
usually carry a vendor build of torch that a fresh venv must not replace, and may have
no network. Results land in ``benchmarks/results/``.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["cpu", "lint"]
nox.options.reuse_existing_virtualenvs = True

CPU_REQUIREMENTS = ["torch==2.13.0", "triton==3.6.0"]
EXAMPLE_PLUGIN = "examples/quantcore-example-plugin"


@nox.session
def cpu(session: nox.Session) -> None:
    """The CPU lane: what CI runs, plus the matrix as a table and as JSON."""
    session.install(*CPU_REQUIREMENTS, "-e", ".[test]", "-e", EXAMPLE_PLUGIN)
    session.run("quantcore", "conformance", "--device", "cpu", "--json", "benchmarks/results/conformance-cpu.json")
    session.run("python", "-m", "pytest", "-n", "auto", "--dist", "loadgroup", *session.posargs)


def _install_here(session: nox.Session) -> None:
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", ".", external=True)


def _device_session(session: nox.Session, device: str) -> None:
    _install_here(session)
    session.run("python", "-m", "quantcore", "doctor", "--device", device, external=True)
    _conformance(session, device)
    session.run(
        "python", "-m", "pytest", "-q", "conformance", "--qc-device", device, "--qc-profile", "full",
        *session.posargs, external=True,
    )


def _conformance(session: nox.Session, device: str) -> None:
    session.run(
        "python", "-m", "quantcore", "conformance", "--device", device, "--profile", "full", "--group", "family",
        "--json", f"benchmarks/results/conformance-{device}.json", external=True,
    )


CUDA_PARTS = ("conformance", "tests", "fuzz", "bench")


@nox.session(python=False)
def cuda(session: nox.Session) -> None:
    """The CUDA lane: the matrix (full profile) as a table and JSON, the test suite with its
    CUDA-only tests, and every benchmark suite timed as CUDA-graph replays (plots beside the
    results). ``-- PART [ARGS]`` runs one part: ``conformance``, ``tests [PYTEST ARGS]``,
    ``fuzz`` (the kernels fuzzed on CUDA, compiled) or ``bench [SUITE ...]`` — each fits a
    time-boxed job on a shared GPU."""
    part, *rest = session.posargs or ["all"]
    if part not in ("all", *CUDA_PARTS):
        session.error(f"nox -s cuda -- PART: expected one of {', '.join(CUDA_PARTS)}, got {part!r}")
    _install_here(session)
    session.run("python", "-m", "quantcore", "doctor", "--device", "cuda", external=True)
    if part in ("all", "conformance"):
        _conformance(session, "cuda")
    if part in ("all", "tests"):
        # --qc-device cuda: Triton compiled, not interpreted (727 passed, 19 skipped on an H100).
        session.run("python", "-m", "pytest", "-q", "-n", "8", "--dist", "loadgroup", "tests", "--qc-device", "cuda",
                    *rest, external=True)
    if part in ("all", "fuzz"):
        # The kernel fuzz again, on CUDA (the tests part fuzzes them on the CPU and already
        # runs the CPU-vs-CUDA determinism tests and the GPU regressions).
        session.run("python", "-m", "pytest", "-q", "-n", "6", "tests/hardening/test_fuzz_kernels.py",
                    "--qc-device", "cuda", *rest, env={"QUANTCORE_FUZZ_DEVICE": "cuda"}, external=True)
    if part in ("all", "bench"):
        for suite in rest or ["all"]:
            session.run(
                "python", "-m", "quantcore", "bench", suite, "--device", "cuda", "--graph", "--save",
                "--plot", f"benchmarks/results/plots/cuda-{suite}.png", external=True,
            )


@nox.session(python=False)
def xpu(session: nox.Session) -> None:
    """Conformance on an Intel XPU (aten_xpu's real op runs only here)."""
    _device_session(session, "xpu")


@nox.session(python=False)
def npu(session: nox.Session) -> None:
    """Conformance on an Ascend NPU (triton_ascend_int4's real target)."""
    _device_session(session, "npu")


@nox.session
def fuzz(session: nox.Session) -> None:
    """The fuzz and fault suites in the nightly profile; prints cases run, refused,
    handled and crashes (``-- --profile ci`` for CI's fixed-seed profile)."""
    session.install(*CPU_REQUIREMENTS, "-e", ".[test]", "-e", EXAMPLE_PLUGIN)
    session.run("python", "-m", "tests.hardening.report", "-n", "auto", "--dist", "loadgroup", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, mypy, and the layers contract (tests/layers.py: imports only point down, no
    import cycles); the contract and ruff also run in CI, as tests."""
    session.install(*CPU_REQUIREMENTS, "-e", ".[lint]")
    session.run("ruff", "check", "quantcore", "backends", "conformance", "benchmarks", "tools", "tests")
    session.run("mypy")
    session.run("python", "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider", "tests/core/test_layers.py")
