"""NVML's clocks event reasons in words, and which of them are the hardware's own slowdown."""

from __future__ import annotations

from service.notify.base import Notification
from service.vocabulary import CLOCK_EVENT_BITS, HW_SLOWDOWN_MASK, clock_event_names, hw_slowdown


def test_bits_are_named_in_nvml_order_and_unknown_bits_are_left_out() -> None:
    assert clock_event_names(None) == [] and clock_event_names(0) == []
    assert clock_event_names(0x1) == ["gpu_idle"]
    assert clock_event_names(0x4 | 0x40 | 0x1000) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert len({name for name, _ in CLOCK_EVENT_BITS.values()}) == len(CLOCK_EVENT_BITS)


def test_only_the_hardwares_own_reasons_are_a_slowdown() -> None:
    # nvml.h: HW slowdown 0x8, HW thermal 0x40, HW power brake 0x80.
    assert HW_SLOWDOWN_MASK == 0x8 | 0x40 | 0x80
    assert not hw_slowdown(None) and not hw_slowdown(0x1 | 0x4 | 0x20)
    assert all(hw_slowdown(bit) for bit in (0x8, 0x40, 0x80))


def _note(memory_unknown: bool) -> Notification:
    return Notification(
        delivery_id="d", kind="firing", status="firing", policy="idle-held-gpu",
        severity="warning", metric="idle_held", aggregate="avg", window="30m", op=">",
        threshold=0.9, value=1.0, scope="gpu", scope_key="GPU-1", labels={},
        active_since="2026-12-07T00:00:00Z", memory_unknown=memory_unknown,
    )  # fmt: skip


def test_an_idle_held_alert_says_when_memory_was_not_seen() -> None:
    assert "memory use not reported" in _note(True).condition()
    assert "memory" not in _note(False).condition()
