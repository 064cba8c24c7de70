"""Benchmarks: each kernel timed against its peers in one process, against the device's
measured ceilings. ``quantcore bench`` is the entry point; ``README.md`` says how to add
a suite. Installed as ``quantcore.benchmarks``."""
