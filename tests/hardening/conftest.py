"""The hardening suites share the fuzz profiles (``QUANTCORE_FUZZ_PROFILE``: ci or nightly)."""

from __future__ import annotations

from .fuzz.profiles import register_profiles

register_profiles()
