"""The Triton layer every Triton backend shares: buffers a launcher keeps between calls
(:mod:`.buffers`) and the compiler's report on a kernel (:mod:`.compile_report`).

Nothing here imports triton at import time: :mod:`.buffers` needs torch only, and
:mod:`.compile_report` imports triton inside its functions.
"""
