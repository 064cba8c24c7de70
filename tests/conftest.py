"""Shared fixtures: an isolated registry per test, so runtime registrations never leak."""

from __future__ import annotations

import importlib.metadata

import pytest

from quantcore.registry import CASES_ENTRY_POINT_GROUP, ENTRY_POINT_GROUP, Registry

# The fuzz suites' tally: counted on every xdist worker, reported by the controller.
from .hardening.fuzz.tally import (  # noqa: F401
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
)


def _third_party_plugins() -> set[str]:
    return {
        ep.name
        for group in (ENTRY_POINT_GROUP, CASES_ENTRY_POINT_GROUP)
        for ep in importlib.metadata.entry_points(group=group)
        if ep.dist is None or ep.dist.name != "quantcore"
    }


@pytest.fixture
def registry() -> Registry:
    """quantcore's own plugins only, private to one test: whatever else is installed
    (the example plugin, a vendor's) is blocked, so candidate lists are predictable."""
    return Registry(blocked=_third_party_plugins()).load()


@pytest.fixture
def empty_registry() -> Registry:
    """A registry that loads no entry points at all."""
    return Registry(entry_point_group=None).load()
