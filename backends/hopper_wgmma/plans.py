"""What one call of the kernel runs: its tile, pipeline depth and K split.

Plain values shared by the rule (``configs.py``) and the shipped tables (``tuned.py``).
Every plan runs on the one prepared layout. :class:`TritonPlan` runs Triton's GEMV or
tensor-core kernel over the same words instead (``small_m.py``), :class:`DecodePlan` the
warp-level decode kernel (``decode.py``): off unless a table names them, where they were
measured faster (small M). A :class:`Plan` changes how many 64-row tiles a CTA
takes (``wg``), how many activation rows (``bm``), how many blocks TMA keeps in flight
(``stages``) and how many programs split K (``split``) — never the weight's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["GATED_MAX_BM", "AnyPlan", "DecodePlan", "Plan", "TritonPlan", "gated_plan_refusal", "plan_from_dict"]

#: wgmma's N, the activation rows of a tile: 8…256 in steps of 8 (powers of two here).
BM_CHOICES = (8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Plan:
    #: Consumer warpgroups per CTA, each 64 weight rows (1 or 2).
    wg: int
    #: Activation rows per tile (wgmma's N).
    bm: int
    #: Shared-memory ring depth: blocks TMA fetches ahead.
    stages: int
    #: Programs splitting K (1: none).
    split: int = 1
    #: Blocks issued between two waits for every wgmma group (1 or 2).
    per_wait: int = 1
    #: Leave each block's wgmma groups in flight while the next block is dequantized (a
    #: wait per block retires the one before); excludes ``per_wait`` 2.
    in_flight: bool = False
    #: Warp-specialised: one producer warp issues every TMA load against per-stage "empty"
    #: barriers and the consumer warpgroups only wait, dequantize and multiply (the
    #: in-flight walk without a CTA barrier per block); needs ``in_flight``. Opt-in: no
    #: shipped table and not the rule name it until a device run has measured it.
    ws: bool = False
    #: Scale late: the operand is the exact ``B + q`` (one LOP3 per pair, nothing else),
    #: each block's product is accumulated apart and folded into the output as
    #: ``s·(Σ(B + q)·x − (B + z)·Σx)`` in fp32 once its groups retire (``Σx`` from a wgmma
    #: of ones). Needs ``in_flight``; 4-bit weights with one scale row per block (groups of
    #: 128 or more) only — elsewhere the plan runs with the scale in the operand.
    late_scale: bool = False
    #: Registers per thread the launch may take (0: the compiler's choice). A
    #: warp-specialised program otherwise takes the whole register file, one CTA per SM —
    #: too few at small M; its consumers get what the producer warp hands back.
    maxnreg: int = 0
    #: A balanced (stream-K) grid of this many programs per SM (0: off): the output tiles'
    #: pairs of K blocks are one sequence cut into equal runs, one per program, so no SM
    #: holds more work than another; a tile shared by programs is summed by the last one
    #: to finish it. Needs ``in_flight``, without ``ws`` or ``late_scale``; replaces
    #: ``split``. Measured slower than the tables' split-K plans (README.md): no table
    #: names one, and a bound launch refuses it.
    stream: int = 0

    def __post_init__(self) -> None:
        if (self.wg not in (1, 2) or self.bm not in BM_CHOICES or not 2 <= self.stages <= 12 or self.split < 1
                or self.per_wait not in (1, 2) or (self.in_flight and self.per_wait != 1)
                or not (self.maxnreg == 0 or 24 <= self.maxnreg <= 255)):
            raise ValueError(f"hopper_wgmma plan out of range: {self}")
        if self.ws and not self.in_flight:
            raise ValueError(f"hopper_wgmma plan: ws (a producer warp) needs in_flight=True, got {self}")
        if self.late_scale and not self.in_flight:
            raise ValueError(f"hopper_wgmma plan: late_scale needs in_flight=True, got {self}")
        if self.stream and (not 0 < self.stream <= 8 or not self.in_flight or self.ws or self.late_scale
                            or self.split != 1):
            raise ValueError(f"hopper_wgmma plan: stream (1…8 programs an SM) needs in_flight=True without ws, "
                             f"late_scale or split, got {self}")

    @property
    def num_warps(self) -> int:
        """The consumer warps a launch asks for; a warp-specialised plan's producer warp
        is added by the compiler (the compiled kernel's ``num_warps`` counts it)."""
        return 4 * self.wg

    def fixed_bytes(self) -> int:
        """Shared memory outside the ring: a late-scale plan's tile of ones (the A operand
        of the wgmma that sums x, ``[64·WG, 32]`` 16-bit)."""
        return 64 * self.wg * 32 * 2 if self.late_scale else 0

    def stage_bytes(self, bits: int, scale_bytes: int, sub_rows: int, zeros: bool) -> int:
        """Shared memory one stage of the ring takes (rows of scales and zero points in
        slots of at least 128 bytes, as TMA writes them; a warp-specialised plan's second
        mbarrier per stage, 8 bytes)."""
        bk = 512 // bits
        row = max(128, 64 * self.wg * scale_bytes) + (max(128, 64 * self.wg) if zeros else 0)
        return self.wg * 4096 + self.bm * bk * 2 + sub_rows * row + 8 * self.ws


@dataclass(frozen=True)
class TritonPlan:
    """A call through the Triton kernels of ``quantcore/kernels/gptq_pairs/triton_kernels.py``
    over the prepared words (``small_m.py``): its path and tile, as ``triton_int4``'s plans."""

    #: "mma": tensor cores, the weight as the left operand; "gemv": CUDA cores, one row of x per program.
    path: Literal["mma", "gemv"] = "mma"
    #: Output rows per program.
    block_n: int = 64
    #: Activation rows per program (mma; the GEMV takes one).
    block_m: int = 16
    #: Programs splitting K (as many as leave each at least one step).
    split: int = 1
    num_warps: int = 4
    #: Triton's software pipeline depth.
    stages: int = 3
    #: Blocks per loop step.
    block_b: int = 1
    #: mma's operand (the kernel's ``OPERAND``): 1 exact integers, 2 scaled, 0 fp32 (the interpreter's).
    operand: int = 1

    def __post_init__(self) -> None:
        if (self.path not in ("mma", "gemv") or self.block_n not in (16, 32, 64, 128, 256)
                or self.block_m not in (16, 32, 64, 128) or self.split < 1 or self.block_b not in (1, 2, 4, 8)
                or self.operand not in (0, 1, 2) or self.num_warps not in (1, 2, 4, 8) or not 1 <= self.stages <= 8):
            raise ValueError(f"hopper_wgmma Triton plan out of range: {self}")


@dataclass(frozen=True)
class DecodePlan:
    """A call through the warp-level decode kernel (``decode.py``, ``decode_bucket.py``):
    each warp reads its rows' words into the registers of ``mma.sync``, x is staged once
    per program, ``split`` programs cut K. Serves at most ``bm`` activation rows, and only
    the shape and card it was measured on (``configs.plan_for``): where it wins is a matter
    of the shape (slower than the wgmma plans at 14336×4096 on the H200, faster at
    8192×28672)."""

    #: Programs splitting K (as many as leave each at least two blocks).
    split: int = 4
    #: Activation rows a launch multiplies: 8 (one ``m16n8k16`` a slice) or 16 (two).
    bm: int = 8
    kind: Literal["decode"] = "decode"

    def __post_init__(self) -> None:
        if self.kind != "decode" or not 1 <= self.split <= 64 or self.bm not in (8, 16):
            raise ValueError(f"hopper_wgmma decode plan out of range: {self}")


AnyPlan = Plan | TritonPlan | DecodePlan


#: A gated call (``quantcore/triton/gluon_split_k.py``'s gated end) takes plans of tiles up to
#: this many rows. On an H200 (``benchmarks/results/probes/gated_end-nvidia-h200.json``, CUDA
#: graphs) the 64-row plans ran 1.6x slower gated than the layer and the activation's launch
#: apart (8192×28672: 121.3 against 74.7 µs): the epilogue's two [128, 64] float32 sums raise the
#: registers to 172 and two programs no longer fit an SM; at 16 rows it took 56.2 against 55.6.
GATED_MAX_BM = 16


def gated_plan_refusal(plan: AnyPlan) -> str:
    """Why ``plan`` cannot end gated, whatever the weight ("" where it can): the Gluon
    kernels end gated, Triton's do not; a tile of at most ``GATED_MAX_BM`` rows, no balanced grid."""
    if isinstance(plan, TritonPlan):
        return "the plan runs the Triton kernels over the words"
    if isinstance(plan, Plan) and (plan.stream or plan.bm > GATED_MAX_BM):
        return f"the plan's tile of {plan.bm} rows (gated up to {GATED_MAX_BM}, no balanced grid)"
    return ""


def plan_from_dict(d: dict[str, Any]) -> AnyPlan:
    """A plan as a table or a timing file holds it (``dataclasses.asdict``): a Triton plan
    names its ``path``, a decode plan its ``kind``."""
    if d.get("kind") == "decode":
        return DecodePlan(**d)
    return TritonPlan(**d) if "path" in d else Plan(**d)
