"""The Triton layer every Triton backend shares: buffers a launcher keeps between calls
(:mod:`.buffers`) and those of a split-K launch (:mod:`.split_k`), the compiler's report
on a kernel (:mod:`.compile_report`), the bound launch whose host cost is a launch
(:mod:`.launch`) and its activation check (:mod:`.checks`).

Nothing here imports triton at ``import quantcore``: :mod:`.buffers`, :mod:`.split_k` and
:mod:`.checks` need torch only, :mod:`.compile_report` imports triton inside its functions, and
:mod:`.launch` (which imports it) is loaded by a backend's launch code on its first call.
"""

__all__ = ["GLUON_BELOW", "TESTED_TRITON"]

#: The oldest Triton the Triton kernels here are written for and tested with (Gluon's API,
#: ``tl.join``/``tl.gather``, the launch attributes of programmatic dependent launch): a
#: kernel lists it in ``Requirements.min_versions``, so an older compiler is passed over by
#: ``get_kernel`` with this reason instead of failing at the kernel's first call.
TESTED_TRITON: tuple[str, str] = ("triton", "3.6")

#: The first Triton release the Gluon kernels (``hopper_wgmma``, TurboQuant's ``mma.sync``
#: decode kernel) are not known to compile with: Gluon (``triton.experimental.gluon``) is
#: experimental and changes between releases — Triton 3.8's has no ``gl.thread_barrier``,
#: which they call. A Gluon kernel lists it in ``Requirements.below_versions``.
GLUON_BELOW: tuple[str, str] = ("triton", "3.7")
