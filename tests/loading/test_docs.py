"""The Python blocks of docs/checkpoints.md run as written, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"

pytest.importorskip("transformers")
pytest.importorskip("safetensors")


def test_the_checkpoint_docs_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"__name__": "docs_checkpoints"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{DOC.name} block {i + 1}", "exec"), namespace)
    assert type(namespace["quantized"].model.layers[0].mlp.up_proj).__name__ == "QuantLinear"
