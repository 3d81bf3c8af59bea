"""Per-process SM and memory utilisation through the fake NVML: one call per GPU per poll."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import service.collectors.nvml as nvml_mod
from service.collectors.batch import build_batch
from service.collectors.nvml import NvmlBackend
from service.wire import IngestBatch
from tests.fake_nvml import FakeGpu, FakeNvml

T0 = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
GIB = 1024**3


@pytest.fixture(autouse=True)
def no_gpm_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_mod, "GPM_MIN_INTERVAL_SECONDS", 0.0)


def by_pid(snap) -> dict[int, tuple[float | None, float | None]]:
    return {p.pid: (p.sm_util, p.mem_util) for p in snap.processes}


def test_each_process_gets_its_own_share_and_the_idle_one_zero() -> None:
    # Seen on an H200: the bf16 loop 3-5 %, the starved loop 1-2 %, the notebook absent.
    gpu = FakeGpu(
        "GPU-0",
        pids=[(101, 2 * GIB), (102, 2 * GIB), (103, 8 * GIB)],
        proc_samples=[(101, 1_000, 4, 2), (101, 1_500, 6, 4), (102, 1_200, 2, 1)],
    )
    lib = FakeNvml([gpu])
    b = NvmlBackend(lib=lib)
    got = by_pid(b.sample(T0))
    assert got[101] == pytest.approx((0.05, 0.03))
    assert got[102] == pytest.approx((0.02, 0.01))
    assert got[103] == (0.0, 0.0)  # listed, no sample: ran no kernels
    assert lib.calls["putil"] == 1  # one call per GPU per poll
    # The next poll asks only for samples after the newest one read: none came, all 0.
    got = by_pid(b.sample(T0 + timedelta(seconds=1)))
    assert got == {101: (0.0, 0.0), 102: (0.0, 0.0), 103: (0.0, 0.0)}
    gpu.proc_samples.append((102, 2_000, 30, 10))
    got = by_pid(b.sample(T0 + timedelta(seconds=2)))
    assert got[102] == pytest.approx((0.30, 0.10))
    assert got[101] == (0.0, 0.0)
    assert lib.calls["putil"] == 3


def test_not_supported_is_absent_and_never_asked_again() -> None:
    gpu = FakeGpu("GPU-0", pids=[(101, GIB), (102, GIB)], unsupported={"putil"})
    lib = FakeNvml([gpu])
    b = NvmlBackend(lib=lib)
    for k in range(3):
        snap = b.sample(T0 + timedelta(seconds=k))
        assert by_pid(snap) == {101: (None, None), 102: (None, None)}
    assert lib.calls["putil"] == 1


def test_no_call_unless_processes_share_the_gpu() -> None:
    lib = FakeNvml(
        [FakeGpu("GPU-0"), FakeGpu("GPU-1", pids=[(7, GIB)], proc_samples=[(7, 1, 50, 5)])]
    )
    snap = NvmlBackend(lib=lib).sample(T0)
    assert "putil" not in lib.calls
    assert by_pid(snap) == {7: (None, None)}  # alone: the GPU's own activity is its activity


def test_shipped_with_the_process_records() -> None:
    gpu = FakeGpu("GPU-0", pids=[(101, GIB), (102, GIB)], proc_samples=[(101, 10, 40, 20)])
    b = NvmlBackend(lib=FakeNvml([gpu]))
    snap = b.sample(T0)
    batch = build_batch(hostname="node-a", labels={}, devices=b.devices(), snapshots=[snap])
    busy, idle = IngestBatch.model_validate(batch).processes
    assert (busy.sm_util, busy.mem_util) == pytest.approx((0.4, 0.2))
    assert (idle.sm_util, idle.mem_util) == (0.0, 0.0)
