"""Per-op oracles: nominal inputs for a kernel call, the golden output computed from the
(possibly mutated) stored tensors as the format defines them, the call itself, and the
judgement. One small class per op; an op without one is fuzzed up to ``prepare`` and
reported as such (see :mod:`.op_oracles`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from hypothesis import strategies as st

from quantcore.formats.base import Format
from quantcore.kernel import Kernel
from quantcore.ops.linear import linear_reference
from quantcore.ops.moe import moe_gemm_reference
from quantcore.ops.moe.harness import GoldenExperts
from quantcore.ops.tolerance import compare, tolerance_for

from .mutations import ALL_DTYPES, NOT_TENSORS, OTHER_DEVICE, mutate_activation, noncontiguous

__all__ = ["Inputs", "LinearOracle", "MoEOracle", "OpOracle", "beyond", "has_tiny", "judge_dense", "on_cpu", "place", "x_draw"]

Inputs = dict[str, Any]


def judge_dense(
    out: Any,
    golden: torch.Tensor,
    act_dtype: torch.dtype,
    *,
    may_overflow: bool,
    atol: torch.Tensor | float = 0.0,
    apriori: tuple[torch.Tensor, int] | None = None,
) -> str | None:
    """Why ``out`` is not an acceptable result for the float64 ``golden``, or None.

    Finite exact results must be matched within the conformance tolerance of
    ``act_dtype`` (fp32's for an fp64 activation a kernel chose to take); where the exact
    result is NaN/Inf (a NaN or Inf in the input) the output must be non-finite too,
    never a made-up number. Two limits of floating point are allowed for, and only when
    the inputs reach them: beyond ``act_dtype``'s range (``may_overflow``) an element
    may be ±Inf/NaN, but every finite one must still be right; below its smallest
    normal number precision is absolute, not relative (``atol`` per element: subnormal
    results may lose bits or be flushed to zero, as hardware does).

    The conformance tolerance is relative to the result, right for well-conditioned
    data. Generated weights are often not (every code at its maximum, so outputs are
    differences of nearly equal sums), and there a correct kernel's rounding error is set
    by the size of the products, not of the result. Where the relative check fails,
    ``apriori`` decides: ``B = Σ_k |x_k| · R_k`` (``R``: the magnitude of what each
    weight is made of, see ``MAGNITUDES``), scaled by ``0.64·√K`` (what ``‖B‖ / ‖y‖`` is
    for Gaussian data), stands in for the result's norm when it is the larger. On
    well-conditioned data that is the conformance tolerance itself; a wrong index, group,
    zero point or permutation fails either way.
    """
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, not a tensor"
    if out.dtype != act_dtype:
        return f"output dtype {out.dtype}, expected {act_dtype}"
    if tuple(out.shape) != tuple(golden.shape):
        return f"output shape {tuple(out.shape)}, expected {tuple(golden.shape)}"
    o = out.detach().to("cpu", torch.float64)
    g = golden.detach().to("cpu", torch.float64)
    g_finite, o_finite = torch.isfinite(g), torch.isfinite(o)
    if (o_finite & ~g_finite).any():
        return f"{int((o_finite & ~g_finite).sum())} finite output element(s) where the exact result is NaN/Inf"
    if (~o_finite & g_finite).any() and not may_overflow:
        return f"{int((~o_finite & g_finite).sum())} non-finite output element(s) where the exact result is finite"
    both = g_finite & o_finite
    if not both.any():
        return None
    diff = o - g
    if not isinstance(atol, float) or atol:
        slack = torch.as_tensor(atol, dtype=torch.float64).expand_as(diff)
        diff = diff.sign() * (diff.abs() - slack).clamp_min(0)
    tol = tolerance_for(act_dtype if act_dtype != torch.float64 else torch.float32)
    verdict = compare(g[both] + diff[both], g[both], tol)
    if verdict.ok:
        return None
    if apriori is not None:
        b, k = apriori
        scale = b.detach().to("cpu", torch.float64).expand_as(g)[both].norm().item() / (0.64 * max(k, 1) ** 0.5)
        ref = max(g[both].norm().item(), scale)
        d = diff[both]
        rel = d.norm().item() / ref if ref > 0 else float("inf")
        mx = d.abs().max().item() / (ref / d.numel() ** 0.5) if ref > 0 else float("inf")
        if rel <= tol.rel and mx <= tol.max:
            return None
        return f"{verdict.problem}; against the products' size: rel {rel:.2e}, max {mx:.2e}"
    return verdict.problem


def on_cpu(values: Mapping[str, Any]) -> dict[str, Any]:
    """The golden references compute on the CPU, wherever the kernel ran."""
    return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in values.items()}


def place(inputs: Inputs, device: torch.device | str) -> Inputs:
    """Nominal inputs (drawn on the CPU) on the kernel's device."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def beyond(t: torch.Tensor, dtype: torch.dtype, margin: float) -> bool:
    finite = t[torch.isfinite(t)]
    return bool(finite.numel()) and finite.abs().max().item() * margin > torch.finfo(dtype).max


def has_tiny(t: torch.Tensor, dtype: torch.dtype, margin: float = 64.0) -> bool:
    """Any non-zero element below ``dtype``'s smallest normal (times a margin)?"""
    a = t[torch.isfinite(t)].abs()
    a = a[a > 0]
    return bool(a.numel()) and a.min().item() < torch.finfo(dtype).smallest_normal * margin


class OpOracle(ABC):
    op: ClassVar[str]
    #: Names a refusal of a call may give (besides the format's tensors and parameters).
    arg_names: ClassVar[tuple[str, ...]]
    #: The op's outputs are the format's stored tensors (checked by its
    #: ``validate_output``, read by its ``dequantize``); ``validate`` checks the layer's.
    writes_format: ClassVar[bool] = False

    @abstractmethod
    def nominal(self, data: st.DataObject, dims: Mapping[str, int], act_dtype: torch.dtype) -> Inputs:
        """Valid inputs for weights of these dims."""

    @abstractmethod
    def golden(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> Any:
        """The exact result (a float64 tensor for a dense op)."""

    def outputs(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> dict[str, torch.Tensor] | None:
        """For an op whose outputs are themselves a stored format (what the format's
        ``dequantize`` reads): the golden ones. None for a dense op."""
        return None

    def check_outputs(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs, out: Any) -> str | None:
        """Why what the golden quantizer wrote for ``inputs`` is wrong, or None (an op
        that ``writes_format`` says how its outputs relate to its input)."""
        raise NotImplementedError(f"{self.op}: an op that writes a format must judge its golden outputs")

    @abstractmethod
    def call(self, kernel: Kernel, prepared: Any, inputs: Inputs) -> Any: ...

    @abstractmethod
    def mutate(self, data: st.DataObject, inputs: Inputs, dims: Mapping[str, int]) -> tuple[str, Inputs]: ...

    @abstractmethod
    def may_overflow(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> bool: ...

    def act_dtype(self, inputs: Inputs) -> torch.dtype:
        x = inputs["x"]
        return x.dtype  # type: ignore[no-any-return]

    def with_dtype(self, inputs: Inputs, dtype: torch.dtype) -> Inputs:
        return {**inputs, "x": inputs["x"].to(dtype)}

    def ranges(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> tuple[bool, torch.Tensor | float]:
        """``(may_overflow, atol)`` for these inputs: see :func:`judge_dense`."""
        return self.may_overflow(fmt, tensors, inputs), 0.0

    def apriori(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> tuple[torch.Tensor, int] | None:
        """``(Σ_k |x_k|·R_k per output element, K)`` (see :func:`judge_dense`)."""
        return None

    def judge(self, out: Any, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> str | None:
        tensors, inputs = on_cpu(tensors), on_cpu(inputs)
        return self.judge_against(out, self.golden(fmt, tensors, inputs), fmt, tensors, inputs)

    def judge_against(self, out: Any, golden: torch.Tensor, fmt: Format, tensors: Mapping[str, torch.Tensor],
                      inputs: Inputs) -> str | None:
        """:func:`judge_dense` of ``out`` against ``golden`` with these inputs' ranges (CPU tensors)."""
        overflow, atol = self.ranges(fmt, tensors, inputs)
        return judge_dense(out, golden, self.act_dtype(inputs), may_overflow=overflow, atol=atol,
                           apriori=self.apriori(fmt, tensors, inputs))


def _group_magnitude(fmt: Format, tensors: Mapping[str, torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    """GPTQ and AWQ: kernels hold ``(q − c)·s`` and a zero offset ``(c − z)·s`` apart,
    each rounded to the activation dtype (torch's int4pack ops, c = 2^(bits−1) = 8), so a
    weight is made of ``|q − c|·|s| + |c − z|·|s|``, which is more than ``|W|`` when q and z
    are both far from c."""
    c = 1 << (int(fmt.bits) - 1)  # type: ignore[attr-defined]
    k = w.shape[-1]
    if hasattr(fmt, "group_index"):
        g = fmt.group_index(tensors).long()
    else:
        g = torch.arange(k) // fmt.effective_group_size(k)  # type: ignore[attr-defined]
    q = fmt.unpack_weight(tensors).double()  # type: ignore[attr-defined]  # [K, N]
    z = fmt.unpack_zeros(tensors).double()[g]  # type: ignore[attr-defined]  # [K, N]
    s = tensors["scales"].detach().double().abs()[g]
    return torch.maximum(w.abs(), (((q - c).abs() + (c - z).abs()) * s).T)


def _moe_magnitude(fmt: Format, tensors: Mapping[str, torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    """TensorRT-LLM MoE: ``q · s + zero``, a sum whose terms may nearly cancel."""
    k = w.shape[1]
    q = tensors["qweight"].double().abs()
    s = fmt.expand_groups(tensors["scales"].double().abs(), k)  # type: ignore[attr-defined]
    z = fmt.expand_groups(tensors["zeros"].double().abs(), k) if "zeros" in tensors else 0.0  # type: ignore[attr-defined]
    return q * s + z


#: Per-format magnitude of what a weight element is made of; default ``|W|``.
MAGNITUDES = {"gptq": _group_magnitude, "awq": _group_magnitude, "trtllm_moe": _moe_magnitude}


def magnitude(fmt: Format, tensors: Mapping[str, torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    fn = MAGNITUDES.get(fmt.name)
    return fn(fmt, tensors, w) if fn is not None else w.abs()


def x_draw(data: st.DataObject, rows: tuple[int, ...], k: int, dtype: torch.dtype) -> torch.Tensor:
    seed = data.draw(st.integers(0, 2**31 - 1), label="x seed")
    return torch.randn(*rows, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _stored_overflow(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> bool:
    return any(
        beyond(t.detach().double().cpu(), dtype, 256.0)
        for t in tensors.values() if isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type != "meta"
    )


class LinearOracle(OpOracle):
    op = "linear"
    arg_names = ("x", "prepared", "dtype")

    def nominal(self, data: st.DataObject, dims: Mapping[str, int], act_dtype: torch.dtype) -> Inputs:
        m = data.draw(st.sampled_from((1, 2, 3, 5, 8, 17)), label="M")
        return {"x": x_draw(data, (m,), dims["K"], act_dtype)}

    def golden(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> torch.Tensor:
        w = fmt.dequantize(tensors, dtype=torch.float64)
        x = inputs["x"].detach()
        return linear_reference(x, w, tensors.get("bias")).reshape(*x.shape[:-1], w.shape[0])

    def call(self, kernel: Kernel, prepared: Any, inputs: Inputs) -> Any:
        return kernel(inputs["x"], prepared)  # type: ignore[operator]

    def mutate(self, data: st.DataObject, inputs: Inputs, dims: Mapping[str, int]) -> tuple[str, Inputs]:
        desc, x = mutate_activation(data, "x", inputs["x"])
        return desc, {"x": x}

    def _bound(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        w = fmt.dequantize(tensors, dtype=torch.float64)
        x = inputs["x"].detach().double().reshape(-1, w.shape[1]).nan_to_num(0.0, 0.0, 0.0)
        bound = x.abs() @ w.abs().T if x.numel() else torch.zeros(1, dtype=torch.float64)
        return w, x, bound

    def may_overflow(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> bool:
        dtype = self.act_dtype(inputs)
        w, x, bound = self._bound(fmt, tensors, inputs)
        return beyond(bound, dtype, 64.0) or beyond(w, dtype, 256.0) or beyond(x, dtype, 64.0) or _stored_overflow(tensors, dtype)

    def apriori(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> tuple[torch.Tensor, int] | None:
        w, x, _ = self._bound(fmt, tensors, inputs)
        r = magnitude(fmt, tensors, w)
        bias = tensors.get("bias")
        b = bias.detach().double().abs() if bias is not None else 0.0
        bound = x.abs() @ r.T + b
        return bound.reshape(*inputs["x"].shape[:-1], w.shape[0]), w.shape[1]

    def ranges(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> tuple[bool, torch.Tensor | float]:
        dtype = self.act_dtype(inputs)
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            dtype = torch.float32
        w, x, bound = self._bound(fmt, tensors, inputs)
        if not (has_tiny(x, dtype) or has_tiny(w, dtype) or has_tiny(bound, dtype)):
            return self.may_overflow(fmt, tensors, inputs), 0.0
        # Each weight and each product may lose everything below the smallest normal.
        smallest = torch.finfo(dtype).smallest_normal
        atol = smallest * (1.0 + x.abs().sum(dim=1, keepdim=True))  # [M, 1]
        x_shape = inputs["x"].shape
        return self.may_overflow(fmt, tensors, inputs), atol.reshape(*x_shape[:-1], 1) if x.numel() else 0.0


class MoEOracle(OpOracle):
    op = "moe"
    arg_names = ("x", "prepared", "dtype", "topk_ids", "topk_weights")

    def nominal(self, data: st.DataObject, dims: Mapping[str, int], act_dtype: torch.dtype) -> Inputs:
        e, k = dims["E"], dims["K"]
        t = data.draw(st.sampled_from((1, 2, 3, 5, 9)), label="T")
        topk = data.draw(st.integers(1, min(e, 4)), label="topk")
        per_route = data.draw(st.booleans(), label="per_route")
        weighted = data.draw(st.booleans(), label="weighted")
        seed = data.draw(st.integers(0, 2**31 - 1), label="route seed")
        gen = torch.Generator().manual_seed(seed)
        ids = torch.rand(t, e, generator=gen).argsort(dim=1)[:, :topk].to(torch.int32)
        weights = torch.softmax(torch.randn(t, topk, generator=gen), dim=-1) if weighted else None
        x = x_draw(data, (t, topk) if per_route else (t,), k, act_dtype)
        return {"x": x, "topk_ids": ids, "topk_weights": weights}

    def golden(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> torch.Tensor:
        x, ids, w = inputs["x"], inputs["topk_ids"], inputs["topk_weights"]
        n = tensors["qweight"].shape[-1]
        if ids.numel() == 0:
            t, topk = ids.shape
            return torch.zeros((t, n) if w is not None else (t, topk, n), dtype=torch.float64)
        return moe_gemm_reference(x.detach(), ids, GoldenExperts(fmt, dict(tensors)), w)

    def call(self, kernel: Kernel, prepared: Any, inputs: Inputs) -> Any:
        return kernel(inputs["x"], inputs["topk_ids"], prepared, topk_weights=inputs["topk_weights"])  # type: ignore[operator]

    def judge(self, out: Any, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> str | None:
        """An expert id outside ``[0, E)`` that a call took: a kernel that does not read the
        ids on the host (on CUDA that read would wait for the GPU's queue) must give each such
        route a NaN row (quantcore/ops/moe/kernel.py, ``check_ids``); every other row is judged
        as usual, against the reference with those routes sent to expert 0."""
        ids, e = inputs["topk_ids"], tensors["qweight"].shape[0]
        if not (isinstance(ids, torch.Tensor) and ids.numel() and not ids.is_floating_point()):
            return super().judge(out, fmt, tensors, inputs)
        stray = ((ids < 0) | (ids >= e)).cpu()
        if not stray.any():
            return super().judge(out, fmt, tensors, inputs)
        cpu = on_cpu(inputs)
        fixed = {**cpu, "topk_ids": torch.where(stray, 0, cpu["topk_ids"])}
        tensors = on_cpu(tensors)
        golden = self.golden(fmt, tensors, fixed).clone()
        golden[stray.any(dim=1) if cpu["topk_weights"] is not None else stray] = float("nan")
        return self.judge_against(out, golden, fmt, tensors, fixed)

    def mutate(self, data: st.DataObject, inputs: Inputs, dims: Mapping[str, int]) -> tuple[str, Inputs]:
        which = data.draw(st.sampled_from(("x", "topk_ids", "topk_ids", "topk_weights")), label="moe arg")
        out = dict(inputs)
        if which == "x":
            desc, out["x"] = mutate_activation(data, "x", inputs["x"])
            return desc, out
        if which == "topk_ids":
            ids = inputs["topk_ids"]
            kind = data.draw(
                st.sampled_from(("E", "-1", "huge", "dtype", "1-D", "3-D", "more slots", "duplicates",
                                 "non-contiguous", "device", "not a tensor")),
                label="ids kind",
            )
            e = dims["E"]
            if kind == "E":
                new = torch.full_like(ids, e)
            elif kind == "-1":
                new = torch.full_like(ids, -1)
            elif kind == "huge":
                new = torch.full_like(ids, torch.iinfo(ids.dtype).max)
            elif kind == "dtype":
                new = ids.to(data.draw(st.sampled_from([d for d in ALL_DTYPES if d != ids.dtype]), label="ids dtype"))
            elif kind == "1-D":
                new = ids.reshape(-1)
            elif kind == "3-D":
                new = ids.unsqueeze(-1)
            elif kind == "more slots":
                new = torch.cat([ids, ids[:, :1]], dim=1)
            elif kind == "duplicates":
                new = ids[:, :1].expand(ids.shape)
            elif kind == "non-contiguous":
                new = noncontiguous(ids)
            elif kind == "device":
                new = ids.to(OTHER_DEVICE)
            else:
                new = data.draw(st.sampled_from(NOT_TENSORS), label="ids value")
            out["topk_ids"] = new
            return f"topk_ids: {kind}", out
        w = inputs["topk_weights"]
        ids = inputs["topk_ids"]
        kind = data.draw(st.sampled_from(("given", "nan", "int", "shape", "device", "not a tensor", "float64")), label="w kind")
        base = w if w is not None else torch.full(ids.shape, 1.0 / ids.shape[1])
        if kind == "given":
            new = base
        elif kind == "nan":
            new = base.clone()
            if new.numel():
                new.view(-1)[0] = float("nan")
        elif kind == "int":
            new = torch.ones(ids.shape, dtype=torch.int32)
        elif kind == "shape":
            new = base[:, :-1] if base.shape[1] > 1 else base.unsqueeze(0)
        elif kind == "device":
            new = base.to(OTHER_DEVICE)
        elif kind == "float64":
            new = base.double()
        else:
            new = data.draw(st.sampled_from(NOT_TENSORS[1:]), label="w value")
        out["topk_weights"] = new
        return f"topk_weights: {kind}", out

    def apriori(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> tuple[torch.Tensor, int] | None:
        x, ids, weights = inputs["x"], inputs["topk_ids"], inputs["topk_weights"]
        if ids.numel() == 0:
            return None
        w = fmt.dequantize(tensors, dtype=torch.float64)  # [E, K, N]
        r = magnitude(fmt, tensors, w)
        t, topk = ids.shape
        rows = x.detach().double().nan_to_num(0.0, 0.0, 0.0).abs()
        rows = rows.repeat_interleave(topk, dim=0) if rows.dim() == 2 else rows.reshape(-1, rows.shape[-1])
        flat = ids.reshape(-1).long()
        bound = torch.stack([rows[i] @ r[flat[i]] for i in range(flat.numel())]).view(t, topk, -1)
        if weights is not None:
            bound = (bound * weights.detach().double().abs().unsqueeze(-1)).sum(dim=1)
        return bound, w.shape[1]

    def may_overflow(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> bool:
        dtype = self.act_dtype(inputs)
        w = fmt.dequantize(tensors, dtype=torch.float64)  # [E, K, N]
        x = inputs["x"].detach().double().nan_to_num(0.0, 0.0, 0.0)
        wmax = w.abs().amax(dim=0)  # [K, N]: a bound over experts
        bound = x.reshape(-1, w.shape[1]).abs() @ wmax if x.numel() else torch.zeros(1, dtype=torch.float64)
        return beyond(bound, dtype, 64.0) or beyond(w, dtype, 256.0) or beyond(x, dtype, 64.0) or _stored_overflow(tensors, dtype)

