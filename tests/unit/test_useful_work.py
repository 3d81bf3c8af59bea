"""The useful-work verdict (service/core/useful_work.py): a keep-alive pattern with nothing read,
nothing written and no progress is sham once it has held for the hold time; a resident kernel
that stopped advancing is hung; progress, I/O, traffic or memory churn make it useful; missing
GPM or /proc evidence makes it unverified; the exemption label wins; a GPU of a multi-GPU job
that departs from its peers is named."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from service.collectors.host_proc import host_fields, read_host
from service.collectors.simulated import SimulatedBackend
from service.core.diagnosis import USELESS_CAUSES, Cause
from service.core.useful_work import (
    EXEMPT_LABEL,
    GpuPoint,
    Hold,
    HostPoint,
    Kind,
    Rules,
    judge,
    odd_gpus,
    sliding,
    sole_holder,
)
from service.costs.recommend import FixAssumptions, constant_fraction
from service.wire import ProcessIn

RULES = Rules(hold_seconds=300.0)
KEEP_ALIVE = {
    "sm_active": 0.48,
    "gr_engine_active": 0.5,
    "gpu_util": 0.5,
    "fb_used_bytes": 2e9,
    "pcie_tx_bytes_per_second": 1e6,
    "pcie_rx_bytes_per_second": 5e6,
}
SPIN = {"sm_active": 0.007, "gr_engine_active": 1.0, "gpu_util": 1.0, "fb_used_bytes": 4e9}


def gpu(values: dict[str, float], seconds: int = 400, **changes: float) -> list[GpuPoint]:
    return [GpuPoint(float(t), values | changes) for t in range(seconds)]


def host(
    seconds: int = 400, *, read_per_s: float = 0.0, switches_per_s: float = 20.0
) -> list[HostPoint]:
    return [
        HostPoint(float(t), 5 + 0.1 * t, 1e6 + read_per_s * t, 1e5, switches_per_s * t, 0, 7)
        for t in range(seconds)
    ]


def test_a_keep_alive_loop_is_sham_with_its_evidence_in_words() -> None:
    v = judge(gpu(KEEP_ALIVE), host(), rules=RULES)
    assert v.kind is Kind.SHAM and v.cause is Cause.SHAM
    assert v.words.startswith("the GPU has been held at a flat 50% duty cycle")
    assert "no data was read or written" in v.words and "no progress reported" in v.words


def test_bursts_at_a_fixed_period_are_named_with_their_period() -> None:
    points = [
        GpuPoint(float(t), KEEP_ALIVE | {"gr_engine_active": 0.3 if t % 4 == 0 else 0.0})
        for t in range(400)
    ]
    v = judge(points, host(), rules=RULES)
    assert v.kind is Kind.SHAM
    assert "burst every 4 s" in v.words


def test_a_resident_kernel_whose_host_thread_is_stuck_is_hung() -> None:
    v = judge(gpu(SPIN), host(switches_per_s=0.0), rules=RULES)
    assert v.kind is Kind.HUNG and v.cause is Cause.HUNG
    assert "resident on 0.7% of its SMs" in v.words


def test_progress_that_stops_while_kernels_stay_resident_is_hung() -> None:
    stopped = [(float(t), 1000.0) for t in range(0, 400, 30)]
    v = judge(gpu(KEEP_ALIVE, gr_engine_active=0.97), host(), stopped, rules=RULES)
    assert v.kind is Kind.HUNG and "progress stopped" in v.words


def test_progress_that_advances_is_never_sham_or_hung() -> None:
    advancing = [(float(t), 10.0 * t) for t in range(0, 400, 30)]
    for values in (KEEP_ALIVE, SPIN):
        assert (
            judge(gpu(values), host(switches_per_s=0), advancing, rules=RULES).kind is Kind.USEFUL
        )


@pytest.mark.parametrize(
    ("points", "hosts", "why"),
    [
        (gpu(KEEP_ALIVE), host(read_per_s=100_000), "read or wrote"),
        (gpu(KEEP_ALIVE, pcie_rx_bytes_per_second=800e6), host(), "PCIe"),
        (
            [GpuPoint(float(t), KEEP_ALIVE | {"fb_used_bytes": 2e9 + t * 1e6}) for t in range(400)],
            host(),
            "memory",
        ),
    ],
)
def test_data_moved_or_memory_churn_is_useful(
    points: list[GpuPoint], hosts: list[HostPoint], why: str
) -> None:
    v = judge(points, hosts, rules=RULES)
    assert v.kind is Kind.USEFUL and why in v.words


def test_partial_evidence_is_unverified_and_takes_no_cause() -> None:
    no_gpm = [{k: v for k, v in KEEP_ALIVE.items() if k != "sm_active"}] * 1
    cases = [
        judge(gpu(KEEP_ALIVE), [], rules=RULES),
        judge(gpu(no_gpm[0]), host(), rules=RULES),
        judge(gpu(KEEP_ALIVE, seconds=120), host(120), rules=RULES),
    ]
    assert [v.kind for v in cases] == [Kind.UNVERIFIED] * 3
    assert all(v.cause is None for v in cases)


def test_the_hold_time_must_pass_before_a_verdict() -> None:
    verdicts = sliding(gpu(KEEP_ALIVE), host(), rules=RULES)
    first = next(i for i, v in enumerate(verdicts) if v.kind is Kind.SHAM)
    assert 0.8 * RULES.hold_seconds <= first <= RULES.hold_seconds
    assert all(v.kind is Kind.SHAM for v in verdicts[first:])


def test_a_labelled_benchmark_is_exempt() -> None:
    v = judge(gpu(KEEP_ALIVE), host(), rules=RULES, labels={EXEMPT_LABEL: "benchmark"})
    assert v.kind is Kind.EXEMPT and v.cause is None


def test_an_idle_gpu_is_left_to_the_idle_causes() -> None:
    v = judge(gpu(KEEP_ALIVE, gr_engine_active=0.0, gpu_util=0.0), host(), rules=RULES)
    assert v.kind is Kind.IDLE


def test_sham_and_hung_time_is_saved_whole_by_releasing_the_gpu() -> None:
    for cause in USELESS_CAUSES:
        fraction, why = constant_fraction(cause, FixAssumptions())
        assert fraction == 1.0 and "released" in why


@pytest.mark.parametrize(
    ("scenarios", "odd"),
    [
        (["training", "training", "training", "idle"], 3),  # a dead rank among working peers
        (["launch-bound", "launch-bound", "idle", "launch-bound"], 2),  # peers wait in NCCL
    ],
)
def test_the_gpu_departing_from_its_peers_is_named(scenarios: list[str], odd: int) -> None:
    """Simulated multi-GPU samples (one job's four GPUs): the odd one is named, with its GPU."""
    start = datetime(2026, 12, 7, tzinfo=UTC)
    b = SimulatedBackend(start=start, gpus=4, scenarios=scenarios, xid_after_seconds=1e9)
    windows: dict[str, list[GpuPoint]] = {}
    for t in range(0, 300, 5):
        snap = b.sample(start + timedelta(seconds=t))
        for r in snap.readings:
            windows.setdefault(r.uuid, []).append(GpuPoint(float(t), r.metrics))
    named = odd_gpus(windows)
    assert [o.gpu_uuid for o in named] == [b.devices()[odd].uuid]
    assert abs(named[0].mean_duty - named[0].peers_duty) >= Rules().odd_duty


def test_the_gpu_is_one_jobs_once_an_observed_job_that_left_is_no_longer_seen() -> None:
    # Job a's processes were last seen at 100 s; its observed hold stays open until the grace
    # period closes it. Job b took the GPU at 105 s.
    left = Hold("a", 0.0, None, observed=True, last_seen=100.0)
    holds = [left, Hold("b", 105.0, None, observed=True, last_seen=200.0)]
    assert sole_holder(holds, 50.0, 99.0) == "a"
    assert sole_holder(holds, 95.0, 110.0) is None  # the GPU changed hands in the window
    assert sole_holder(holds, 104.0, 120.0) is None  # b did not hold it all the window
    assert sole_holder(holds, 106.0, 200.0) == "b"
    # A scheduler's hold is what it says until it ends; two at once: a shared GPU, no one's.
    registered = [Hold("a", 0.0, None), Hold("b", 105.0, None, observed=True, last_seen=200.0)]
    assert sole_holder(registered, 106.0, 200.0) is None
    assert sole_holder([Hold("a", 0.0, 150.0)], 100.0, 160.0) is None
    assert sole_holder([Hold("a", 0.0, 150.0)], 100.0, 150.0) == "a"


def test_the_host_side_of_a_real_process_and_its_children_is_read() -> None:
    script = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(2)'])\n"
        "sys.stdin.readline()\n"
        "open(__import__('os').devnull, 'w').write('x' * 300000)\n"
        "for _ in range(5): time.sleep(0.01)\n"
        "sys.stdin.readline()\n"
        "c.wait()\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, text=True)
    try:
        for _ in range(100):
            first = read_host(p.pid)
            if first is not None and first.children == 1:
                break
            time.sleep(0.02)
        assert first is not None and first.children == 1
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
        for _ in range(100):
            later = read_host(p.pid)
            if later is not None and later.write_bytes - first.write_bytes >= 300000:
                break
            time.sleep(0.02)
        assert later is not None
        assert later.write_bytes - first.write_bytes >= 300000
        assert later.voluntary_switches > first.voluntary_switches
        assert later.cpu_seconds >= first.cpu_seconds
        p.stdin.write("end\n")
        p.stdin.flush()
    finally:
        if p.stdin is not None:
            p.stdin.close()
        p.wait(10)
    assert read_host(p.pid) is None  # gone: no figures, never zeros
    assert read_host(os.getpid()) is not None


def test_host_fields_travel_as_optional_wire_fields() -> None:
    totals = read_host(os.getpid())
    assert totals is not None
    fields = host_fields(totals)
    base = {"gpu_uuid": "GPU-a", "ts": "2026-12-07T10:00:00Z", "pid": os.getpid()}
    got = ProcessIn.model_validate(base | fields)
    assert got.host_read_bytes == totals.read_bytes
    assert ProcessIn.model_validate(base).host_read_bytes is None  # an older agent
    assert host_fields(None) == {}
