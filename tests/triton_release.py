"""Which Triton release is installed, for the tests written against one release's internals.

The CI pins the release the Triton kernels are tested with (``quantcore.triton.TESTED_TRITON``).
Under another one the kernels check themselves (``Requirements``: a Gluon kernel refuses a
release past ``GLUON_BELOW``; the direct launch reads its launcher and falls back with a
reason), and the tests that fake or compile that release's internals are skipped, naming it.
"""

from __future__ import annotations

import pytest

from quantcore.kernel import Requirements
from quantcore.probe import probe
from quantcore.probe.packages import installed_version, release
from quantcore.triton import GLUON_BELOW, TESTED_TRITON

__all__ = ["needs_gluon_release", "needs_tested_release"]

_VERSION = installed_version("triton", ("triton",))[1] or ""
_GLUON = Requirements(device_types=frozenset({"cpu"}), min_versions=(TESTED_TRITON,), below_versions=(GLUON_BELOW,))
_GLUON_WHY = _GLUON.check(probe("cpu")) if _VERSION else None

#: For tests that compile the Gluon kernels.
needs_gluon_release = pytest.mark.skipif(
    _GLUON_WHY is not None, reason=f"the Gluon kernels are refused on this Triton: {_GLUON_WHY}")
#: For tests that fake the internals of the release the kernels are tested with, or bound
#: what its compiler generates (registers, instructions a weight).
needs_tested_release = pytest.mark.skipif(
    release(_VERSION)[:2] != release(TESTED_TRITON[1])[:2],
    reason=f"written against Triton {TESTED_TRITON[1]}'s internals or code generation; triton {_VERSION or 'absent'} is installed")
