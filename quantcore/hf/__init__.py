"""quantcore in Hugging Face transformers: ``from_pretrained`` loads GPTQ, AWQ and
compressed-tensors checkpoints with quantcore's modules, and ``save_pretrained`` writes a
checkpoint that ``from_pretrained`` and :func:`quantcore.load_quantized` read back.

    import quantcore.hf
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, config=quantcore.hf.config_for(path))

Importing this module imports transformers and registers the ``quantcore`` quantization
config and quantizer (``import quantcore`` alone imports neither). See docs/checkpoints.md.
"""

from .config import QuantCoreConfig, config_for
from .quantizer import QuantCoreHfQuantizer

__all__ = ["QuantCoreConfig", "QuantCoreHfQuantizer", "config_for"]
