"""The built-in backends, each a plugin registered through the ``quantcore`` entry-point
group exactly as a third party's would be (see pyproject.toml)."""
