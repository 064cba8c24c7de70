"""One-off measurements, each named by the question it answers (see README.md here); the
suites (``quantcore bench``) are what is rerun. Run a probe from the repository root with
``python -m tools.probes.NAME`` on the device it names."""
