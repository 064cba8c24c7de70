"""AWQ storage format, GEMM layout (AutoAWQ's ``WQLinear_GEMM``)."""

from .format import AWQ
from .order import AWQ_ORDER, AWQ_REVERSE_ORDER, pack_awq, unpack_awq

__all__ = ["AWQ", "AWQ_ORDER", "AWQ_REVERSE_ORDER", "pack_awq", "unpack_awq"]
