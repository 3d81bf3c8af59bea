"""The NVML backend against a scripted fake pynvml: units, GPM buffers, faults and cadence."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import service.collectors.nvml as nvml_mod
import service.collectors.nvml_fields as fields_mod
from service.collectors.backend import BackendError
from service.collectors.nvml import NvmlBackend
from service.vocabulary import METRIC_NAMES, ActivitySource
from tests.fake_nvml import FakeGpu, FakeNvml

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def no_gpm_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real minimum between GPM samples is 0.1 s; the fake needs none.
    monkeypatch.setattr(nvml_mod, "GPM_MIN_INTERVAL_SECONDS", 0.0)


def poll(b: NvmlBackend, k: int = 1):
    return b.sample(T0 + timedelta(seconds=10 * k))


def test_gpm_metrics_become_ratios_and_bytes_per_second():
    lib = FakeNvml([FakeGpu("GPU-0", pids=[(4242, 3 * 2**30)])])
    b = NvmlBackend(lib=lib)
    snap = poll(b)
    (r,) = snap.readings
    assert r.source is ActivitySource.GPM
    assert r.metrics["sm_active"] == pytest.approx(0.97)
    assert r.metrics["tensor_active"] == pytest.approx(0.94)
    assert r.metrics["dram_active"] == pytest.approx(0.16)
    assert r.metrics["pcie_tx_bytes_per_second"] == 10 * 1024 * 1024
    assert r.metrics["power_watts"] == 650.0
    assert r.metrics["sm_clock_hz"] == 1.98e9
    assert r.metrics["gpu_util"] == 1.0
    assert "nvlink_tx_bytes_per_second" not in r.metrics  # unsupported there: absent, never 0
    assert [(p.pid, p.fb_used_bytes) for p in snap.processes] == [(4242, 3 * 2**30)]


def test_gpm_alternates_two_buffers_and_never_uses_the_legacy_pcie_call():
    lib = FakeNvml([FakeGpu("GPU-0")])
    b = NvmlBackend(lib=lib)
    for k in range(5):
        poll(b, k)  # the fake asserts sample1 is not sample2 on every metrics call
    assert lib.calls["gpm_metrics"] == 5
    assert not hasattr(lib, "nvmlDeviceGetPcieThroughput")  # calling it would raise


def test_energy_counter_is_read_every_sixth_cycle_only():
    lib = FakeNvml([FakeGpu("GPU-0")])
    b = NvmlBackend(lib=lib, energy_every_cycles=6)
    got = ["energy_joules" in poll(b, k).readings[0].metrics for k in range(12)]
    assert got == [True] + [False] * 5 + [True] + [False] * 5
    assert lib.calls["energy"] == 2
    assert poll(b, 12).readings[0].metrics["energy_joules"] == pytest.approx(123_456.0)


def test_gpu_without_gpm_falls_back_to_duty_cycle_and_says_so():
    lib = FakeNvml([FakeGpu("GPU-old", gpm=False)])
    (r,) = poll(NvmlBackend(lib=lib)).readings
    assert r.source is ActivitySource.NVML
    assert "sm_active" not in r.metrics
    assert r.metrics["gpu_util"] == 1.0


def test_unsupported_field_is_absent_and_never_asked_again():
    lib = FakeNvml([FakeGpu("GPU-0", unsupported={"power"})])
    b = NvmlBackend(lib=lib)
    for k in range(4):
        assert "power_watts" not in poll(b, k).readings[0].metrics
    assert lib.calls["power"] == 1


def test_lost_gpu_is_flagged_while_the_others_keep_reporting():
    lib = FakeNvml([FakeGpu("GPU-0"), FakeGpu("GPU-1"), FakeGpu("GPU-2")])
    b = NvmlBackend(lib=lib)
    assert len(poll(b, 1).readings) == 3
    lib.gpus[1].lost = True
    snap = poll(b, 2)
    assert [r.uuid for r in snap.readings] == ["GPU-0", "GPU-2"]
    assert [(d.uuid, d.lost) for d in b.devices()] == [
        ("GPU-0", False),
        ("GPU-1", True),
        ("GPU-2", False),
    ]
    assert [r.uuid for r in poll(b, 3).readings] == ["GPU-0", "GPU-2"]


def test_xid_events_are_polled_with_timeout_zero_and_reported_once():
    lib = FakeNvml([FakeGpu("GPU-0"), FakeGpu("GPU-1")])
    b = NvmlBackend(lib=lib)
    poll(b, 1)
    lib.events.append(("GPU-1", 79))
    snap = poll(b, 2)
    by = {r.uuid: r.metrics for r in snap.readings}
    assert by["GPU-1"]["xid_last"] == 79
    assert "xid_last" not in by["GPU-0"]
    assert "xid_last" not in poll(b, 3).readings[1].metrics


def test_driver_failure_raises_backend_error_and_reopen_recovers():
    lib = FakeNvml([FakeGpu("GPU-0")])
    b = NvmlBackend(lib=lib)
    poll(b, 1)
    lib.driver_broken = True
    with pytest.raises(BackendError):
        poll(b, 2)
    assert not lib.initialised  # NVML was shut down, to be re-initialised
    lib.driver_broken = False
    lib.init_fails = 1
    with pytest.raises(BackendError):
        poll(b, 3)  # init fails once more: still an error, not a crash
    assert len(poll(b, 4).readings) == 1
    assert lib.init_calls == 3


def test_mig_instances_are_gpus_of_their_own_with_gpm_from_the_parent():
    migs = [
        FakeGpu(
            "MIG-a", total=35 * 2**30, gpu_instance_id=1, gpm_values={2: 50.0}, pids=[(7, 2**30)]
        ),
        FakeGpu("MIG-b", total=35 * 2**30, gpu_instance_id=2, gpm_values={2: 0.0}),
    ]
    lib = FakeNvml([FakeGpu("GPU-parent", migs=migs), FakeGpu("GPU-plain")])
    b = NvmlBackend(lib=lib)
    devs = {d.uuid: d for d in b.devices()}
    assert set(devs) == {"MIG-a", "MIG-b", "GPU-plain"}
    assert devs["MIG-a"].mig_parent_uuid == "GPU-parent" and devs["MIG-a"].index == 0
    assert devs["MIG-a"].fb_total_bytes == 35 * 2**30
    snap = poll(b)
    by = {r.uuid: r.metrics for r in snap.readings}
    assert by["MIG-a"]["sm_active"] == 0.5 and by["MIG-b"]["sm_active"] == 0.0
    assert [(p.gpu_uuid, p.pid) for p in snap.processes] == [("MIG-a", 7)]


def test_every_canonical_metric_has_one_nvml_source():
    sources = [f.metric for f in fields_mod.GPM_FIELDS]
    sources += [m for g in fields_mod.GETTERS for m in g.metrics]
    sources += list(fields_mod.EVENT_METRICS)
    assert sorted(sources) == sorted(METRIC_NAMES)


def test_health_counters_are_read_with_energy_and_absent_where_unsupported():
    broken = FakeGpu("GPU-1", remapped_uncorrectable=3, remap_failed=True, pcie_replays=17)
    old = FakeGpu("GPU-2", unsupported={"remap"})  # pre-Ampere: no row remapping
    lib = FakeNvml([FakeGpu("GPU-0"), broken, old])
    b = NvmlBackend(lib=lib, energy_every_cycles=6)
    m = {r.uuid: r.metrics for r in poll(b, 0).readings}
    assert (m["GPU-0"]["row_remap_failure"], m["GPU-0"]["pcie_replays"]) == (0, 0)
    assert m["GPU-1"]["row_remap_failure"] == 1
    assert m["GPU-1"]["remapped_rows_uncorrectable"] == 3 and m["GPU-1"]["pcie_replays"] == 17
    assert "row_remap_failure" not in m["GPU-2"] and "pcie_replays" in m["GPU-2"]
    assert "pcie_replays" not in poll(b, 1).readings[0].metrics  # not every cycle


def test_encoder_and_decoder_utilisation_are_read_and_absent_where_unsupported():
    # NVML's duty cycle counts kernels only: a GPU decoding video reads gpu_util 0.
    video = FakeGpu("GPU-v", gpm=False, util=0, enc_util=9, dec_util=46)
    old = FakeGpu("GPU-o", gpm=False, unsupported={"enc", "dec"})
    lib = FakeNvml([video, old])
    b = NvmlBackend(lib=lib)
    for k in range(3):
        got = {r.uuid: r.metrics for r in poll(b, k).readings}
    assert got["GPU-v"]["gpu_util"] == 0.0
    assert got["GPU-v"]["enc_util"] == pytest.approx(0.09)
    assert got["GPU-v"]["dec_util"] == pytest.approx(0.46)
    assert "enc_util" not in got["GPU-o"] and "dec_util" not in got["GPU-o"]
    assert lib.calls["enc"] == 4 and lib.calls["dec"] == 4  # unsupported: asked once


def test_ecc_nvlink_and_retired_pages_are_read_in_one_field_values_call():
    # A lone H100 answers double-bit ECC only (Hopper remaps rows; no NVLink peers).
    faulty = FakeGpu("GPU-1", fields={4: 2, 31: 1, 38: 40, 52: 7, 59: 1, 30: 3})
    none = FakeGpu("GPU-2", fields={})  # a GPU without ECC or NVLink: asked once only
    lib = FakeNvml([FakeGpu("GPU-0"), faulty, none])
    b = NvmlBackend(lib=lib, energy_every_cycles=1)
    m = {r.uuid: r.metrics for r in poll(b, 0).readings}
    got = {k: m["GPU-0"][k] for k in fields_mod.HEALTH_FIELDS.values() if k in m["GPU-0"]}
    assert got == {"ecc_dbe_errors": 0}  # unsupported ones are absent, not 0
    assert m["GPU-1"]["ecc_dbe_errors"] == 2 and m["GPU-1"]["retired_pages_dbe"] == 3
    assert m["GPU-1"]["nvlink_recovery_errors"] == 1 and m["GPU-1"]["retired_pages_pending"] == 1
    assert not set(fields_mod.HEALTH_FIELDS.values()) & set(m["GPU-2"])
    asked = lib.calls["health"]
    poll(b, 1)
    assert lib.calls["health"] == asked + 2  # GPU-2 is not asked again


def test_clock_event_reasons_are_read_every_poll():
    hot = FakeGpu("GPU-1", clocks_event_reasons=0x40 | 0x4)  # HW thermal + SW power cap
    lib = FakeNvml([FakeGpu("GPU-0"), hot])
    b = NvmlBackend(lib=lib, energy_every_cycles=6)
    for cycle in (0, 1):
        m = {r.uuid: r.metrics for r in poll(b, cycle).readings}
        assert m["GPU-0"]["clocks_event_reasons"] == 0x1
        assert m["GPU-1"]["clocks_event_reasons"] == 0x44
