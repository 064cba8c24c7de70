"""What is computed. Each op kind is one folder, ``quantcore/ops/<name>/``, whose
``__init__`` declares it (:class:`~.op.Op`: inputs, output rule, weight dims, harness) and
whose ``reference.py`` holds its golden reference in float64; :mod:`.case`,
:mod:`.harness` and :mod:`.tolerance` are shared by all of them: a case's weights and
inputs are drawn and a kernel's output judged against the reference by the op's harness."""

from __future__ import annotations

from .kinds import get_op, op_kinds
from .op import Op

__all__ = ["Op", "get_op", "op_kinds"]
