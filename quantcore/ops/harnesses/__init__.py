"""One module per op, each exposing ``HARNESS`` (see :mod:`quantcore.ops.harness`)."""
