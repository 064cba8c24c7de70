"""One module per op, each exposing ``HARNESS`` (see :mod:`quantcore.conformance.harness`)."""
