"""Writing a command's result as a table on the terminal and, on request, as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["emit_json"]


def emit_json(data: Any, path: str | None) -> None:
    """``--json PATH`` writes there; ``--json -`` writes to stdout."""
    if path is None:
        return
    text = json.dumps(data, indent=1, default=str)
    if path == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
        print(f"wrote {path}", file=sys.stderr)
