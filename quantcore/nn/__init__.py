"""Torch modules that hold one quantized weight each, prepared by the best kernel for
their device (chosen and prepared as :func:`quantcore.bind` does, with its fallback):
:class:`~quantcore.nn.quant_module.QuantModule` for any op kind,
:class:`~quantcore.nn.linear.QuantLinear` for any linear format, the MoE and SVDQuant
modules, ``quantize_``, and TurboQuant's model API, offload and kernel pass contract
(:mod:`quantcore.nn.turboquant`). The layer above selection and binding."""
