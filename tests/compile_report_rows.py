"""The rows ``python -m tools.compile_report NAME [ARGS]`` prints: each kernel variant
compiled for sm_90a with Triton's bundled ptxas, in a process of its own with the
interpreter off (it would compile nothing) — what the sm_90 compile tests assert on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["compile_report_rows"]

ROOT = Path(__file__).resolve().parents[1]


def compile_report_rows(*args: str, timeout: int = 600) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "tools.compile_report", *args],
                         capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)  # type: ignore[no-any-return]
