"""The module-level guard of test files that only a CUDA GPU with compiled Triton kernels can
run: skip the whole module without a CUDA device or under Triton's interpreter (which the
quantcore pytest plugin turns on unless ``--qc-device cuda``)."""

from __future__ import annotations

import os

import pytest
import torch


def skip_unless_compiled_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device", allow_module_level=True)
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Triton's interpreter is on: run with --qc-device cuda", allow_module_level=True)
