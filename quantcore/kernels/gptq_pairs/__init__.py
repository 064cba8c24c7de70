"""What the GPTQ/AWQ kernels over pair-interleaved codes share (``triton_int4``,
``hopper_wgmma``): the words (:mod:`.layout`), the prepared state's common fields
(:mod:`.weights`), the kernel base with its checks, prepare flow and call
(:mod:`.kernel`), what a plan depends on (:mod:`.plans`) and the inline PTX that turns
a word into an operand register (:mod:`.ptx`). Each backend keeps its own arrangement of
the words, its kernels, launch, plans and tables. Nothing here imports triton."""
