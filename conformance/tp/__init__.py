"""The tensor-parallel matrix: every format's shards, run by every kernel registered for
it, put back together as an engine's collectives would, judged against the unsharded
golden output and the unsharded kernel's (see :mod:`.runner`)."""

from .cases import WORLDS, tp_cases
from .runner import TPCell, collect_tp_cells, run_tp_cell

__all__ = ["WORLDS", "TPCell", "collect_tp_cells", "run_tp_cell", "tp_cases"]
