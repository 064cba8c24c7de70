"""The ``quantcore`` command: the core's list, doctor and explain, plus the commands the
layers above contribute through the ``quantcore.commands`` entry points (conformance,
bench)."""
