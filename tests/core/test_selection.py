"""get_kernel and explain: ranking, refusals with reasons, overrides, caching."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import quantcore
from quantcore.errors import NoKernelError, UnknownFormatError
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import Support
from quantcore.problem import Problem
from quantcore.registry import Registry
from quantcore.selection import ENV_DISABLE, ENV_FORCE, ENV_PREFER, Explanation, explain, get_kernel
from quantcore.selection.state import selection_state

from .fakes import Plugin, dense_kernel, refusing_kernel

P = Problem.linear(GPTQ(), M=1, K=4096, N=4096, dtype=torch.bfloat16)


def statuses(expl: quantcore.Explanation) -> dict[str, tuple[str, str]]:
    return {c.kernel: (c.status, c.reason) for c in expl.candidates}


def test_cpu_picks_aten_cpu_and_lists_every_candidate(registry: Registry) -> None:
    k = get_kernel("gptq", "cpu", problem=P, registry=registry)
    assert k.name == "aten_cpu" and k.fmt == P.format and k.device == torch.device("cpu")
    rows = statuses(explain("gptq", "cpu", problem=P, registry=registry))
    assert rows["aten_cpu"][0] == "selected"
    assert rows["torch_fallback"][0] == "usable"


def test_xpu_refuses_all_with_reasons(registry: Registry) -> None:
    expl = explain("gptq", "xpu", registry=registry)
    rows = statuses(expl)
    assert rows["aten_cpu"] == ("refused", "runs on cpu, not xpu")
    assert rows["torch_fallback"][0] == "refused" and "XPU" in rows["torch_fallback"][1]
    assert expl.selected is None
    with pytest.raises(NoKernelError) as info:
        get_kernel("gptq", "xpu", registry=registry)
    message = str(info.value)
    assert "aten_cpu" in message and "runs on cpu, not xpu" in message and "torch_fallback" in message
    assert info.value.explanation == expl


def test_problem_limits_move_the_choice(registry: Registry) -> None:
    odd = Problem.linear(GPTQ(), M=1, K=4096, N=40)
    assert get_kernel("gptq", "cpu", problem=odd, registry=registry).name == "torch_fallback"
    rows = statuses(explain("gptq", "cpu", problem=odd, registry=registry))
    assert rows["aten_cpu"] == ("refused", "N=40: the op packs weights only when N % 16 == 0")


def test_without_problem_the_note_says_limits_are_unchecked(registry: Registry) -> None:
    expl = explain("gptq", "cpu", registry=registry)
    assert "shape and dtype limits unchecked" in expl.selected.reason


def test_priority_then_prefer(registry: Registry) -> None:
    registry.register(Plugin(dense_kernel("fast", priority=200)), name="fastplug")
    assert get_kernel("gptq", "cpu", problem=P, registry=registry).name == "fast"
    assert get_kernel("gptq", "cpu", problem=P, prefer="aten_cpu", registry=registry).name == "aten_cpu"
    assert get_kernel("gptq", "cpu", problem=P, prefer=["nope", "torch_fallback"], registry=registry).name == "torch_fallback"


def test_env_disable_force_prefer(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DISABLE, "aten_cpu")
    assert get_kernel("gptq", "cpu", problem=P, registry=registry).name == "torch_fallback"
    assert statuses(explain("gptq", "cpu", problem=P, registry=registry))["aten_cpu"] == (
        "disabled", f"{ENV_DISABLE}=aten_cpu")
    monkeypatch.delenv(ENV_DISABLE)
    monkeypatch.setenv(ENV_FORCE, "torch_fallback")
    assert get_kernel("gptq", "cpu", problem=P, registry=registry).name == "torch_fallback"
    monkeypatch.setenv(ENV_FORCE, "aten_cpu")
    with pytest.raises(NoKernelError, match="N=40"):
        get_kernel("gptq", "cpu", problem=Problem.linear(GPTQ(), K=64, N=40), registry=registry)
    monkeypatch.delenv(ENV_FORCE)
    monkeypatch.setenv(ENV_PREFER, "torch_fallback")
    assert get_kernel("gptq", "cpu", problem=P, registry=registry).name == "torch_fallback"


def test_a_cached_choice_follows_the_environment_set_after_it(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    assert get_kernel("gptq", "cpu", problem=P, registry=registry).name == "aten_cpu"  # cached now
    monkeypatch.setenv(ENV_PREFER, "torch_fallback")
    assert get_kernel("gptq", "cpu", problem=P, registry=registry).name == "torch_fallback"
    monkeypatch.delenv(ENV_PREFER)
    assert get_kernel("gptq", "cpu", problem=P, registry=registry).name == "aten_cpu"


def test_the_environment_key_is_read_from_a_stand_in_for_os_environ_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.selection import environment as env_mod

    for var in (ENV_DISABLE, ENV_FORCE, env_mod.ENV_ALLOW_DENSE):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(ENV_PREFER, "torch_fallback")
    raw = env_mod.environment_key()  # os.environ's raw mapping
    assert raw[2] is not None and [raw[0], raw[1], raw[3]] == [None, None, None]
    monkeypatch.setattr(env_mod.os, "environ", {ENV_PREFER: "torch_fallback"})  # a plain mapping
    assert env_mod.environment_key() == (None, None, "torch_fallback", None)


def test_disable_by_plugin_name(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DISABLE, "torch_fallback")
    assert statuses(explain("gptq", "cpu", registry=registry))["torch_fallback"][0] == "disabled"


def test_kernels_whose_checks_raise_are_refused_not_chosen(registry: Registry) -> None:
    boom = dense_kernel("boom", priority=500)

    @classmethod  # type: ignore[misc]
    def supports(cls, problem):
        raise ZeroDivisionError("bad vendor math")

    boom.supports = supports
    registry.register(Plugin(boom), name="boomplug")
    rows = statuses(explain("gptq", "cpu", problem=P, registry=registry))
    assert rows["boom"] == ("refused", "failed at run time: supports raised ZeroDivisionError: bad vendor math")
    assert not selection_state(registry).failures  # explain only reads
    assert get_kernel("gptq", "cpu", problem=P, registry=registry).name == "aten_cpu"
    # get_kernel acted on the ranking: remembered, refused on this device from now on
    # (shown by quantcore list), without asking the kernel again.
    assert list(selection_state(registry).failures) == [("gptq", "linear", "boom", "cpu")]
    boom.supports = classmethod(lambda cls, problem: Support.yes())  # type: ignore[method-assign]
    assert statuses(explain("gptq", "cpu", problem=P, registry=registry))["boom"][0] == "refused"


def test_explain_has_no_side_effects(registry: Registry) -> None:
    """explain, however often and whatever it meets, leaves the registry and the selection
    state as they were: same generation, no failure recorded."""
    boom = dense_kernel("boom", priority=500)
    boom.check_device = classmethod(lambda cls, caps: 1 / 0)  # type: ignore[method-assign]
    registry.register(Plugin(boom), name="boomplug")
    state = selection_state(registry)
    before = (registry.generation, state.stamp(), state.failures)
    for _ in range(2):
        expl = explain("gptq", "cpu", problem=P, registry=registry)
        assert expl.selected is not None and expl.selected.kernel == "aten_cpu"
        explain("gptq", "xpu", registry=registry)
    assert (registry.generation, state.stamp(), state.failures) == before


def test_refusal_reason_and_broken_plugins_are_shown(registry: Registry) -> None:
    registry.register(Plugin(refusing_kernel("picky", "only K=42")), name="pickyplug")
    registry.register(Plugin(17), name="garbage")
    expl = explain("gptq", "cpu", problem=P, registry=registry)
    rows = statuses(expl)
    assert rows["picky"] == ("refused", "only K=42")
    broken = [c for c in expl.candidates if c.status == "broken"]
    assert broken and broken[0].plugin == "garbage"
    assert "garbage" in expl.table() and "only K=42" in expl.table()
    assert expl.as_dict()["selected"] == "aten_cpu"


def test_one_explanation_per_call(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """explain builds one Explanation (its batch sweep only ranks); get_kernel builds one
    only to say why nothing can run."""
    import quantcore.selection as selection

    built: list[Explanation] = []

    class Counted(Explanation):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(selection, "Explanation", Counted)
    expl = explain("gptq", "cpu", problem=P, registry=registry)
    assert built == [expl] and len(expl.by_batch) == 13 and expl.selected.kernel == "aten_cpu"
    built.clear()
    get_kernel("gptq", "cpu", problem=P, registry=registry)
    assert built == []
    with pytest.raises(NoKernelError):
        get_kernel("gptq", "xpu", problem=P, registry=registry)
    assert len(built) == 1


def test_cache_returns_same_kernel_and_invalidates_on_register(registry: Registry) -> None:
    a = get_kernel("gptq", "cpu", problem=P, registry=registry)
    assert get_kernel("gptq", "cpu", problem=P, registry=registry) is a
    registry.register(Plugin(dense_kernel("newer", priority=300)), name="later")
    assert get_kernel("gptq", "cpu", problem=P, registry=registry).name == "newer"


def test_format_and_problem_must_agree(registry: Registry) -> None:
    with pytest.raises(UnknownFormatError, match="disagrees"):
        get_kernel("awq-not-registered", "cpu", problem=P, registry=registry)
    with pytest.raises(ValueError, match="disagrees"):
        explain(GPTQ(bits=8), "cpu", problem=P, registry=registry)


def test_support_is_a_truthy_pair() -> None:
    ok, why = Support.no("because")
    assert not Support.no("x") and Support.yes() and (ok, why) == (False, "because")


def test_top_level_api_runs_as_the_package_docstring_shows() -> None:
    gen = torch.Generator().manual_seed(3)
    fmt = GPTQ(bits=4, group_size=128, sym=False)
    tensors = fmt.quantize(torch.randn(256, 512, generator=gen), generator=gen)
    k = quantcore.get_kernel("gptq", "cpu", problem=Problem.linear(fmt, M=2, K=512, N=256, dtype=torch.float32))
    prepared = k.prepare(tensors)
    x = torch.randn(2, 512, generator=gen)
    y = k(x, prepared)
    ref = x.double() @ fmt.dequantize(tensors).T
    assert (y.double() - ref).norm() / ref.norm() < 1e-5
    assert quantcore.explain("gptq", "xpu").selected is None
