"""An op kind, declared once: what a kernel call takes and returns, the rule for the
shapes of its output, the dims of its weight and its harness (golden reference and judge).

Everything else that is per op kind is read from this declaration: the
``quantcore::<name>`` custom op and its fake implementation (:mod:`quantcore.custom_ops`),
the problem and the call of a module holding one weight (:mod:`quantcore.nn`), the
conformance matrix and tuning (through :attr:`Op.harness`). An op kind is a folder
``quantcore/ops/<name>/`` whose ``__init__`` defines ``OP``; nothing else lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .harness import OpHarness

__all__ = ["Op", "OutputRule"]

#: ``rule(fmt, dims, *inputs, **options)``: empty tensors shaped like the kernel's output,
#: from the inputs' shapes, the format and the problem dims alone (the custom op's fake).
OutputRule = Callable[..., Any]


@dataclass(frozen=True, kw_only=True)
class Op:
    name: str
    #: Every dim of a problem of this op, in the order the docs name them.
    dims: tuple[str, ...]
    #: The dims one weight fixes (the others come with each call: the batch, ``topk``).
    weight_dims: tuple[str, ...]
    doc: str
    #: The tensors a kernel takes before its prepared state, in order: ``kernel(x, prepared)``.
    inputs: tuple[str, ...] = ("x",)
    #: Optional tensors a kernel takes by keyword after the prepared state (``topk_weights``).
    options: tuple[str, ...] = ()
    output: OutputRule
    #: The named tuple a kernel returns when its output is several tensors; None: one tensor.
    result: type[tuple[Any, ...]] | None = None
    harness: OpHarness
    #: Dims a valid problem may set to 0 (the LoRA rank of ``act_quant_lora``: no branch).
    may_be_zero: tuple[str, ...] = ()

    def output_problem(self, fmt: Any, dims: Any, inputs: Any, options: Any, out: Any) -> str:
        """Why ``out``, a kernel's answer to ``inputs``, is not what this op returns (the
        output rule's shapes and dtypes, computed on meta copies of the inputs), or ""."""
        import torch

        def meta(t: Any) -> Any:
            return t.to("meta") if isinstance(t, torch.Tensor) else t

        want = self.output(fmt, dims, *map(meta, inputs), **{k: meta(v) for k, v in options.items()})
        wants = tuple(want) if isinstance(want, tuple) else (want,)
        gots = tuple(out) if isinstance(out, tuple) else (out,)
        if len(gots) != len(wants):
            return f"returned {len(gots)} value(s), expected {len(wants)}"
        for i, (got, exp) in enumerate(zip(gots, wants, strict=True)):
            which = f"output {i}" if len(wants) > 1 else "the output"
            if not isinstance(got, torch.Tensor):
                return f"{which} is a {type(got).__name__}, expected a tensor"
            if got.shape != exp.shape or got.dtype != exp.dtype:
                return (f"{which} is {str(got.dtype).removeprefix('torch.')} {list(got.shape)}, expected "
                        f"{str(exp.dtype).removeprefix('torch.')} {list(exp.shape)}")
        return ""

    @property
    def schema(self) -> str:
        """The custom op's schema: the inputs, the optional tensors, then the prepared
        state's tensors and the spec naming the kernel (:mod:`quantcore.custom_ops`)."""
        args = [f"Tensor {n}" for n in self.inputs] + [f"Tensor? {n}" for n in self.options]
        outs = "Tensor" if self.result is None else "(" + ", ".join("Tensor" for _ in self.result._fields) + ")"  # type: ignore[attr-defined]
        return f"({', '.join([*args, 'Tensor[] state', 'str spec'])}) -> {outs}"
