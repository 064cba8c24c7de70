"""Hypothesis profiles for the fuzz suites, chosen with ``QUANTCORE_FUZZ_PROFILE``.

``ci`` (the default): derandomized (a fixed seed per test), no example database, a
bounded number of examples per test, so every push runs the same cases in bounded time.
``nightly``: random seeds, the example database on, and enough examples that the
suites generate more than 10,000 cases (``nox -s fuzz`` or
``python -m tests.hardening.report``).

Each fuzz test asks :func:`examples` for its own count, by budget class, so the ratio
between the suites stays the same in both profiles.

``QUANTCORE_FUZZ_DEVICE`` (default ``cpu``) is the device the kernels are fuzzed on:
``cuda`` on a GPU host fuzzes the kernels that run there, compiled (with
``--qc-device cuda``, which leaves Triton's interpreter off).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["DEVICE", "ENV_DEVICE", "ENV_PROFILE", "PROFILE", "examples", "register_profiles"]

ENV_PROFILE = "QUANTCORE_FUZZ_PROFILE"
ENV_DEVICE = "QUANTCORE_FUZZ_DEVICE"
PROFILES = ("ci", "nightly")

#: Examples per test, by budget class: "fast" for pure-Python validation paths, "kernel"
#: for a prepare + call against the golden, "slow" for kernels that run under Triton's
#: interpreter on a CPU, "io" for a checkpoint folder written, spoiled and loaded.
_EXAMPLES = {
    "ci": {"fast": 100, "kernel": 80, "slow": 10, "io": 40},
    "nightly": {"fast": 1500, "kernel": 700, "slow": 60, "io": 300},
}


def _profile() -> str:
    name = os.environ.get(ENV_PROFILE, "ci").strip() or "ci"
    if name not in PROFILES:
        raise RuntimeError(f"{ENV_PROFILE}: expected one of {PROFILES}, got {name!r}")
    return name


PROFILE = _profile()
DEVICE = os.environ.get(ENV_DEVICE, "cpu").strip() or "cpu"


def examples(budget: str) -> int:
    return _EXAMPLES[PROFILE][budget]


def register_profiles() -> None:
    common = {
        "deadline": None,
        "suppress_health_check": [
            HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture,
        ],
        "print_blob": True,
    }
    settings.register_profile("quantcore-ci", derandomize=True, database=None, **common)
    settings.register_profile("quantcore-nightly", derandomize=False, **common)
    settings.load_profile(f"quantcore-{PROFILE}")
