"""``import quantcore`` is cheap and pulls in no heavy dependency."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys, time
t = time.perf_counter()
import quantcore
dt = time.perf_counter() - t
print(dt, "torch" in sys.modules, "triton" in sys.modules)
quantcore.get_kernel("gptq", "cpu")
print("triton" in sys.modules, "cuda.tile" in sys.modules)
print(sorted(m for m in sys.modules if m.startswith(("quantcore.conformance", "quantcore.benchmarks"))))
"""


def test_import_is_light_and_lazy() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    first, second, above = out.stdout.split("\n")[:3]
    seconds, torch_loaded, triton_loaded = first.split()
    assert float(seconds) < 0.5
    assert torch_loaded == "False" and triton_loaded == "False"
    assert second == "False False"  # selecting a CPU kernel loads the registry, not triton
    assert above == "[]"  # nor the matrix or the bench: their plugins load when they run
