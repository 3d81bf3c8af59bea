"""The agent loop under each row of the delivery table, against a scripted central service.

Central is an httpx MockTransport that answers by the batch's content, so each test can say
exactly which poll central refuses and how; the agent runs on a scripted clock.
"""

from __future__ import annotations

import json
import logging
import math
import random
import zlib
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from service.collectors.agent import Agent, AgentConfig
from service.collectors.backend import Device, GpuReading, ProcessReading, Snapshot
from service.collectors.spool import Spool
from service.delivery import RetryPolicy, rfc3339
from service.vocabulary import ActivitySource
from service.wire import MAX_BATCH_PROCESSES, IngestBatch
from tests.agent_support import FakeMonotonic, mock_shipper
from tests.support import FakeClock

Answer = tuple[int, dict[str, str]]


class ScriptedCentral:
    """Answers each batch by ``rule(batch, now)``; records (status, poll times) per request."""

    def __init__(self, clock: FakeClock, rule: Callable[[dict[str, Any], datetime], Answer]):
        self.clock = clock
        self.rule = rule
        self.calls: list[tuple[int, list[str]]] = []
        self.stored: list[str] = []  # poll times central took, in arrival order

    def __call__(self, request: httpx.Request) -> httpx.Response:
        batch = json.loads(zlib.decompress(request.content, 16 + zlib.MAX_WBITS))
        IngestBatch.model_validate(batch)  # every batch the agent sends is valid wire format
        stamps = sorted({s["ts"] for s in batch["samples"]})
        status, headers = self.rule(batch, self.clock())
        self.calls.append((status, stamps))
        if status == 200:
            self.stored.extend(stamps)
        return httpx.Response(status, headers=headers, json={"detail": f"answer {status}"})


class FakeBackend:
    """Two GPUs; ``metrics(ts)`` says what each reports at ``ts``."""

    name = "fake"

    def __init__(self, metrics: Callable[[datetime], dict[str, float]] | None = None) -> None:
        self.metrics = metrics or (lambda ts: {"gpu_util": 0.5, "power_watts": 300.0})
        self.processes = 0

    def devices(self) -> list[Device]:
        return [Device(f"GPU-{i}", i, "NVIDIA H100 80GB HBM3") for i in range(2)]

    def sample(self, now: datetime) -> Snapshot:
        readings = [
            GpuReading(f"GPU-{i}", dict(self.metrics(now)), ActivitySource.NVML) for i in range(2)
        ]
        procs = [ProcessReading("GPU-0", pid=1000 + k) for k in range(self.processes)]
        return Snapshot(ts=now, readings=readings, processes=procs)

    def close(self) -> None:
        pass


def make(
    tmp: Path,
    clock: FakeClock,
    rule: Callable[[dict[str, Any], datetime], Answer],
    *,
    batch_cycles: int = 1,
    backend: FakeBackend | None = None,
) -> tuple[Agent, ScriptedCentral]:
    central = ScriptedCentral(clock, rule)
    agent = Agent(
        config=AgentConfig(
            hostname="node-a",
            labels={},
            interval_seconds=10.0,
            batch_cycles=batch_cycles,
            dead_letter_path=tmp / "dead.jsonl",
            retry=RetryPolicy(base_seconds=5, cap_seconds=60),
        ),
        backend=backend or FakeBackend(),
        shipper=mock_shipper(central),
        spool=Spool(tmp / "spool.sqlite"),
        clock=clock,
        monotonic=FakeMonotonic(clock),
        rng=random.Random(7),
    )
    return agent, central


def run(agent: Agent, clock: FakeClock, cycles: int) -> list[str]:
    """Run ``cycles`` cycles 10 s apart; returns the poll times taken."""
    taken = []
    for _ in range(cycles):
        taken.append(rfc3339(clock()))
        agent.run_once()
        clock.advance(10)
    return taken


def dead_lettered(tmp: Path) -> list[str]:
    path = tmp / "dead.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return sorted({s["ts"] for line in lines for s in json.loads(line)["batch"]["samples"]})


def metric(agent: Agent, name: str, labels: dict[str, str] | None = None) -> float:
    return agent.telemetry.registry.get_sample_value(name, labels or {}) or 0.0


def test_refused_credentials_keep_every_poll_until_the_token_is_fixed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    fixed_at = clock().timestamp() + 600
    agent, central = make(
        tmp_path, clock, lambda b, now: (200, {}) if now.timestamp() >= fixed_at else (401, {})
    )
    with caplog.at_level(logging.ERROR):
        taken = run(agent, clock, 90)  # ten minutes refused, then five accepted
    agent.close()
    assert central.stored == taken  # every poll, once, in order
    assert dead_lettered(tmp_path) == [] and agent.dead_letters == 0
    refused = [s for s, _ in central.calls if s == 401]
    assert 4 <= len(refused) <= 20  # backed off (cap 60 s), not once per cycle
    said = [r for r in caplog.records if "credentials" in r.getMessage()]
    assert 1 <= len(said) <= 10  # clearly, at most once a minute
    assert metric(agent, "gpuwarden_agent_errors_total", {"kind": "ship_credentials"}) == len(
        refused
    )


def test_bad_content_splits_the_batch_and_dead_letters_only_the_bad_poll(tmp_path: Path) -> None:
    clock = FakeClock()
    bad = rfc3339(clock().replace(second=40))

    def rule(batch: dict[str, Any], now: datetime) -> Answer:
        if any(s["ts"] == bad for s in batch["samples"]):
            return 422, {}
        return 200, {}

    agent, central = make(tmp_path, clock, rule, batch_cycles=3)
    taken = run(agent, clock, 12)
    agent.close()
    assert dead_lettered(tmp_path) == [bad]
    assert central.stored == [t for t in taken if t != bad]  # the good polls, in order
    assert metric(agent, "gpuwarden_agent_dead_letter_batches_total") == 1
    assert metric(agent, "gpuwarden_agent_split_batches_total") == 1
    assert agent.spool.depth == 0
    # One request for the batch of three, then one per poll of it; the rest three at a time.
    assert [len(s) for _, s in central.calls] == [3, 3, 1, 1, 1, 3, 3]


def test_a_poll_central_fails_on_is_set_aside_and_newer_ones_flow(tmp_path: Path) -> None:
    clock = FakeClock()
    poison = rfc3339(clock().replace(second=20))
    healed_at = clock().timestamp() + 900  # central fails on that poll for 15 minutes

    def rule(batch: dict[str, Any], now: datetime) -> Answer:
        if any(s["ts"] == poison for s in batch["samples"]) and now.timestamp() < healed_at:
            return 500, {}
        return 200, {}

    agent, central = make(tmp_path, clock, rule)
    taken = []
    depths = []
    for _ in range(150):
        taken.append(rfc3339(clock()))
        agent.run_once()
        depths.append(agent.spool.depth)
        clock.advance(10)
    clock.advance(1800)  # the longest a poll is ever set aside
    agent.close()
    assert dead_lettered(tmp_path) == []  # never dropped
    assert sorted(central.stored) == taken and len(central.stored) == len(taken)
    # The poll after the poisoned one arrives within three tries of it (about a minute at
    # most), not after the fifteen minutes the poisoned one is refused.
    after = taken[taken.index(poison) + 1]
    position = central.stored.index(after)
    assert position < 12
    assert max(depths) <= 8  # nothing piles up behind it
    assert central.stored.index(poison) > position  # it came later, behind newer ones
    assert metric(agent, "gpuwarden_agent_set_aside_batches_total") >= 3


def test_busy_central_is_retried_without_limit_after_its_retry_after(tmp_path: Path) -> None:
    clock = FakeClock()
    start = clock().timestamp()

    def rule(batch: dict[str, Any], now: datetime) -> Answer:
        if now.timestamp() - start < 1800:
            return 429, {"Retry-After": "120"}
        return 200, {}

    agent, central = make(tmp_path, clock, rule)
    taken = run(agent, clock, 200)
    agent.close()
    refused = [s for s, _ in central.calls if s == 429]
    assert 10 <= len(refused) <= 16  # every two minutes for half an hour, no more often
    assert central.stored == taken and dead_lettered(tmp_path) == []


def test_implausible_values_are_dropped_from_their_sample_and_the_rest_ships(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    t0 = clock().timestamp()

    def metrics(ts: datetime) -> dict[str, float]:
        glitch = 20 <= ts.timestamp() - t0 < 50  # three polls of glitches
        return {
            "gpu_util": 4294967295.0 * 0.01 if glitch else 0.5,  # DCGM#199, scaled
            "power_watts": math.nan if glitch else 300.0,
            "temperature_celsius": math.inf if glitch else 60.0,
            "energy_joules": 9223372036854775794.0 if glitch else 1e6,  # INT64 not-supported
            "fb_used_bytes": 2.0**64 if glitch else 2.0**30,
            "sm_clock_hz": 1.5e9,
            # Finite but past what hardware can report (vocabulary.METRIC_BOUNDS).
            "pcie_tx_bytes_per_second": 1.797e308 if glitch else 1e9,
            "nvlink_rx_bytes_per_second": 2e13 if glitch else 1e11,
        }

    seen: list[dict[str, Any]] = []

    def rule(batch: dict[str, Any], now: datetime) -> Answer:
        seen.extend(batch["samples"])
        return 200, {}

    agent, central = make(tmp_path, clock, rule, backend=FakeBackend(metrics))
    with caplog.at_level(logging.WARNING):
        taken = run(agent, clock, 8)
    agent.close()
    assert central.stored == taken  # every poll shipped
    assert len(seen) == 16
    for s in seen:
        glitch = s["ts"] in taken[2:5]
        assert s["metrics"]["sm_clock_hz"] == 1.5e9  # the good fields always ship
        assert ("power_watts" in s["metrics"]) is not glitch
        assert ("gpu_util" in s["metrics"]) is not glitch
    for name, reason in [
        ("power_watts", "not finite"),
        ("temperature_celsius", "not finite"),
        ("gpu_util", "out of range"),
        ("energy_joules", "DCGM sentinel"),
        ("fb_used_bytes", "out of range"),
        ("pcie_tx_bytes_per_second", "out of range"),
        ("nvlink_rx_bytes_per_second", "out of range"),
    ]:
        labels = {"field": name, "reason": reason}
        assert metric(agent, "gpuwarden_agent_dropped_fields_total", labels) == 6  # 3 polls x 2
    said = [r.getMessage() for r in caplog.records if "dropped from its sample" in r.getMessage()]
    assert len(said) == 14  # once per GPU and field, not once per poll


def test_a_poll_beyond_central_limits_travels_in_several_batches(tmp_path: Path) -> None:
    clock = FakeClock()
    backend = FakeBackend()
    backend.processes = 2 * MAX_BATCH_PROCESSES + 5
    sizes: list[int] = []

    def rule(batch: dict[str, Any], now: datetime) -> Answer:
        sizes.append(len(batch["processes"]))
        return 200, {}

    agent, _ = make(tmp_path, clock, rule, backend=backend)
    run(agent, clock, 1)
    agent.close()
    assert sizes == [MAX_BATCH_PROCESSES, MAX_BATCH_PROCESSES, 5]


def test_dcgm_exporter_glitches_reach_the_agent_check_and_never_break_a_scrape() -> None:
    from service.collectors.dcgm_exporter import parse_exposition
    from service.collectors.plausible import drop_implausible

    labels = 'gpu="0",UUID="GPU-x",modelName="NVIDIA H100 80GB HBM3"'
    text = "".join(
        f"# TYPE {n} gauge\n{n}{{{labels}}} {v}\n"
        for n, v in [
            ("DCGM_FI_DEV_POWER_USAGE", "NaN"),
            ("DCGM_FI_DEV_FB_USED", "+Inf"),
            ("DCGM_FI_DEV_FB_FREE", "1000"),
            ("DCGM_FI_DEV_GPU_TEMP", "-Inf"),
            ("DCGM_FI_DEV_SM_CLOCK", "1980"),
        ]
    )
    (reading,) = parse_exposition(text).readings
    dropped = {(d.field, d.reason) for d in drop_implausible([reading])}
    assert dropped == {
        ("power_watts", "not finite"),
        ("fb_used_bytes", "not finite"),
        ("temperature_celsius", "not finite"),
    }
    assert reading.metrics == {"sm_clock_hz": 1.98e9, "fb_free_bytes": 1000 * 2**20}


def test_batches_spooled_gzipped_by_an_older_agent_are_shipped_too(tmp_path: Path) -> None:
    from service.collectors.batch import encode

    clock = FakeClock()
    old = Spool(tmp_path / "spool.sqlite")
    legacy = {
        "node": {"hostname": "node-a", "labels": {}},
        "gpus": [{"uuid": "GPU-0", "index": 0, "model": "NVIDIA H100 80GB HBM3"}],
        "samples": [
            {"gpu_uuid": "GPU-0", "ts": rfc3339(clock()), "metrics": {"gpu_util": 0.1}},
            {"gpu_uuid": "GPU-0", "ts": "2026-12-02T07:59:50Z", "metrics": {"gpu_util": 0.2}},
        ],
        "processes": [],
    }
    old.push(encode(legacy), now=clock().timestamp() - 60)  # gzip, sizes unknown
    old.close()
    clock.advance(10)
    agent, central = make(tmp_path, clock, lambda b, now: (200, {}), batch_cycles=3)
    run(agent, clock, 3)
    agent.close()
    assert [len(s) for _, s in central.calls] == [2, 3]  # the old batch alone, then 3 polls


def test_impossible_process_readings_are_dropped_and_the_poll_ships(tmp_path: Path) -> None:
    clock = FakeClock()

    class OddProcesses(FakeBackend):
        def sample(self, now: datetime) -> Snapshot:
            snap = super().sample(now)
            snap.processes = [
                ProcessReading("GPU-0", pid=4242, fb_used_bytes=2**30),
                ProcessReading("GPU-0", pid=2**32, fb_used_bytes=2**30),  # no such PID
                ProcessReading("GPU-1", pid=77, fb_used_bytes=2**64 - 1),  # NVML "not available"
            ]
            return snap

    shipped: list[dict[str, Any]] = []

    def rule(batch: dict[str, Any], now: datetime) -> Answer:
        shipped.extend(batch["processes"])  # the batch validated against the wire model
        return 200, {}

    agent, central = make(tmp_path, clock, rule, backend=OddProcesses())
    run(agent, clock, 2)
    agent.close()
    assert [s for s, _ in central.calls] == [200, 200]
    assert [(p["pid"], p["fb_used_bytes"]) for p in shipped] == [(4242, 2**30), (77, None)] * 2
    for field in ("process.pid", "process.fb_used_bytes"):
        labels = {"field": field, "reason": "out of range"}
        assert metric(agent, "gpuwarden_agent_dropped_fields_total", labels) == 2


def test_job_ends_left_by_the_epilog_are_kept_until_central_takes_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each job end in the folder moves into the spool; 503 and 403 keep it for the next cycle,
    2xx and 404 (a job central never registered) end it, an unreadable file is set aside."""
    clock = FakeClock()
    answers = {"slurm:1": [503, 403, 200], "slurm:2": [404]}
    seen: list[tuple[str, str, Any]] = []

    def central(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(200, json={"samples_received": 2, "processes_received": 0,
                                             "gpus": 2})  # fmt: skip
        job = unquote(request.url.path.removeprefix("/api/v1/jobs/"))
        seen.append((request.method, job, json.loads(request.content)["ended_at"]))
        return httpx.Response(answers[job].pop(0), json={"detail": "scripted"})

    ends = tmp_path / "job-ends"
    ends.mkdir()
    (ends / "slurm_1.json").write_text('{"job_id": "slurm:1", "ended_at": "2026-12-02T07:59:00Z"}')
    (ends / "slurm_2.json").write_text('{"job_id": "slurm:2", "ended_at": "2026-12-02T07:59:30Z"}')
    (ends / "torn.json").write_text('{"job_id": "slu')
    (ends / ".slurm_3.123").write_text("being written")  # not renamed yet: left alone
    agent = Agent(
        config=AgentConfig(hostname="node-a", labels={}, dead_letter_path=tmp_path / "d.jsonl",
                           job_end_dir=ends),
        backend=FakeBackend(),
        shipper=mock_shipper(central),
        spool=Spool(tmp_path / "spool.sqlite"),
        clock=clock,
        monotonic=FakeMonotonic(clock),
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        run(agent, clock, 3)
    assert sorted(p.name for p in ends.iterdir()) == [".slurm_3.123", "torn.bad"]
    assert seen == [
        ("PATCH", "slurm:1", "2026-12-02T07:59:00Z"),  # 503: kept, the rest waits
        ("PATCH", "slurm:1", "2026-12-02T07:59:00Z"),  # 403: kept
        ("PATCH", "slurm:1", "2026-12-02T07:59:00Z"),  # 200: done
        ("PATCH", "slurm:2", "2026-12-02T07:59:30Z"),  # 404: never registered, dropped
    ]
    assert agent.spool.job_ends() == []
    assert any("torn.json cannot be read" in m for m in caplog.messages)
    assert any("refused the end of job slurm:2" in m for m in caplog.messages)
    agent.close()
