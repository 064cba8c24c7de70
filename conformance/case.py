"""The conformance case. It lives with the ops' golden references
(:mod:`quantcore.ops.case`), which tuning shares; the matrix and plugins import it from here
or from :mod:`quantcore.conformance`."""

from quantcore.ops.case import PROFILES, Case

__all__ = ["PROFILES", "Case"]
