"""Writing a command's result as a table on the terminal and, on request, as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["emit_json"]


def emit_json(data: Any, path: str | None) -> None:
    """``--json PATH`` writes there; ``--json -`` writes to stdout."""
    if path is None:
        return
    text = json.dumps(data, indent=1, default=str)
    if path == "-":
        sys.stdout.write(text + "\n")
        return
    target = Path(path)
    if target.is_dir():
        raise InvalidArgumentError(f"--json {path}: a directory; expected the path of a file to write")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n")
    except OSError as exc:
        raise InvalidArgumentError(f"--json {path}: cannot be written ({exc.strerror or exc})") from None
    print(f"wrote {path}", file=sys.stderr)
