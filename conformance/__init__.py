"""The conformance matrix: every format × backend × shape against one golden reference.

Run it with ``quantcore conformance`` (a table) or with pytest (one test per cell); a
third party runs the same cells against its plugin with
``pytest --pyargs quantcore.conformance --qc-backend NAME``.
"""

from .case import PROFILES, Case
from .runner import Cell, CellResult, collect_cells, run_cell, run_matrix

__all__ = ["PROFILES", "Case", "Cell", "CellResult", "collect_cells", "run_cell", "run_matrix"]
