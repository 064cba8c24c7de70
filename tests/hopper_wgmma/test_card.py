"""The card key tuned tables are keyed by: read off the driver's properties, separating
an H100 from an H200 by bandwidth class, not by name."""

from __future__ import annotations

from types import SimpleNamespace

from quantcore.probe.card import CardKey, key_of_properties


def _props(**kw: object) -> SimpleNamespace:
    base = dict(major=9, minor=0, multi_processor_count=132, shared_memory_per_block_optin=232448)
    return SimpleNamespace(**(base | kw))


def test_h100_and_h200_differ_by_bandwidth_class_only() -> None:
    h100 = key_of_properties(_props(name="NVIDIA H100 80GB HBM3", memory_clock_rate=2619000, memory_bus_width=5120))
    h200 = key_of_properties(_props(name="NVIDIA H200", memory_clock_rate=3201000, memory_bus_width=6144))
    assert h100 == CardKey("sm_90", 132, 227, 3)
    assert h200 == CardKey("sm_90", 132, 227, 4)
    assert h200.slug == "sm_90-132sm-227k-4tbps"


def test_a_renamed_card_gets_the_same_key() -> None:
    a = key_of_properties(_props(name="NVIDIA H100 80GB HBM3", memory_clock_rate=2619000, memory_bus_width=5120))
    b = key_of_properties(_props(name="a cloud's H100", memory_clock_rate=2619000, memory_bus_width=5120))
    assert a == b


def test_unknown_bandwidth_is_class_zero_and_matches_any() -> None:
    key = key_of_properties(_props())
    assert key.bandwidth_class == 0 and key.slug.endswith("bw-unknown")
    tables = [CardKey("sm_90", 114, 227, 2), CardKey("sm_90", 132, 227, 4)]
    assert key.nearest(tables) == CardKey("sm_90", 132, 227, 4)  # nearest SM count


def test_nearest_prefers_the_bandwidth_class_then_sms() -> None:
    tables = [CardKey("sm_90", 132, 227, 4), CardKey("sm_90", 114, 227, 2)]
    assert CardKey("sm_90", 132, 227, 2).nearest(tables) == CardKey("sm_90", 114, 227, 2)
    assert CardKey("sm_90", 132, 227, 3).nearest(tables) in tables
    assert CardKey("sm_80", 108, 163, 2).nearest(tables) is None
