"""Torch modules that run quantized weights through the kernel :func:`quantcore.bind`
chooses, with their runtime: :class:`quantcore.checkpoint.QuantLinear` for any linear
format, and TurboQuant's model API, offload and kernel pass contract
(:mod:`quantcore.nn.turboquant`). The layer above selection and binding."""
