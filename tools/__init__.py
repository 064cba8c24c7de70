"""Tools for the people who work on quantcore: not installed, run from the repository root
(``python -m tools.NAME``). See README.md here."""
