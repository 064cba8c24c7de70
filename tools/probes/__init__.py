"""One-off measurements that answered a question once (see README.md here); the suites
(``quantcore bench``) are what is rerun. Run a probe with ``python -m
quantcore.benchmarks.probes.NAME`` on the device it names."""
