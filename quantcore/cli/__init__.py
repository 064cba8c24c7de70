"""The ``quantcore`` command: list, doctor, explain, conformance."""
