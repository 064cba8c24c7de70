"""Kernel code more than one backend builds on, below the backends: per format, the kernel
base classes (the checks, the prepared state, the call contract), the declared costs, and
the Triton kernels two registrations share.

A backend subclasses what is here and never imports another backend; a third party's
kernel for one of these formats subclasses the same bases. Nothing here imports triton
at import time.

- :mod:`.compressed_tensors` a GPTQ kernel behind the pack-quantized → GPTQ transform (every GPTQ backend)
- :mod:`.gated_activation` ``act(gate) · up`` of a fused gate/up layer's output, one Triton
                        launch on CUDA (the tensor-parallel MLP block, ``quantcore.checkpoint.parallel``)
- :mod:`.gptq_pairs`    GPTQ/AWQ linears over pair-interleaved codes: the words, the kernel base
                        and the PTX that dequantizes a pair (``triton_int4``, ``hopper_wgmma``)
- :mod:`.int4pack_cpu`  torch's CPU int4pack op behind a linear kernel (``aten_cpu``, ``awq_cpu``)
- :mod:`.svdquant`      the ``act_quant_lora`` kernels' base and their one Triton kernel
                        (``triton_nvfp4``, ``triton_ascend_int4``, ``svdquant_torch``)
- :mod:`.trtllm_moe`    the TensorRT-LLM MoE kernels' base and cost
- :mod:`.turboquant`    the TurboQuant pass contract (:class:`.turboquant.TurboQuantLinearKernel`),
                        the fused kernels' base and the cost (``turboquant_*``, ``nn.turboquant``)
"""
