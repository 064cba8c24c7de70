"""trtllm_moe on a GPU: the Triton kernel's tile sweep at the seed's shape against bf16
per-expert cuBLAS, every tile checked first. The sweep lives with the kernel
(:mod:`quantcore.backends.trtllm_moe.gpu_sweep`); this entry point is kept for the
command the results page names.

    python -m quantcore.benchmarks.probes.trtllm_moe --out DIR [--only T,T] [--jobs N]
"""

from __future__ import annotations

from quantcore.backends.trtllm_moe.gpu_sweep import main

if __name__ == "__main__":
    main()
