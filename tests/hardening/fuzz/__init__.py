"""The fuzz machinery of the hardening suite: hypothesis profiles, the outcome tally,
seed weights drawn from what the registry holds, mutations, and per-op oracles."""
