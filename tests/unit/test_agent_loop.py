"""The agent loop with fake backends and a mock central service: attribution, backoff, metrics."""

from __future__ import annotations

import json
import zlib
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

import service.collectors.nvml as nvml_mod
from service.cli.main import build_parser
from service.collectors.agent import Agent, AgentConfig
from service.collectors.attribution import JobAttributor
from service.collectors.nvml import NvmlBackend
from service.collectors.runner import parse_labels, serve_metrics
from service.collectors.spool import Spool
from service.delivery import Backoff
from service.errors import ConfigError
from service.wire import IngestBatch
from tests.agent_support import FakeMonotonic, mock_shipper
from tests.fake_nvml import FakeGpu, FakeNvml
from tests.support import FakeClock, free_port
from tests.unit.attribution_support import SLURM_V2, make_proc


class Central:
    def __init__(self) -> None:
        self.batches: list[dict] = []  # type: ignore[type-arg]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.batches.append(json.loads(zlib.decompress(request.content, 16 + zlib.MAX_WBITS)))
        return httpx.Response(200, json={})


def nvml_agent(tmp: Path, lib: FakeNvml, central: Central, clock: FakeClock, **kw) -> Agent:
    return Agent(
        config=AgentConfig(hostname="gpu-7", labels={"rack": "r9"}, dead_letter_path=tmp / "dl"),
        backend=NvmlBackend(lib=lib),
        shipper=mock_shipper(central, "http://c"),
        spool=Spool(tmp / "spool.sqlite"),
        clock=clock,
        monotonic=FakeMonotonic(clock),
        **kw,
    )


@pytest.fixture(autouse=True)
def no_gpm_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_mod, "GPM_MIN_INTERVAL_SECONDS", 0.0)


def test_processes_are_attributed_and_idle_mapped_gpus_still_report_their_job(tmp_path: Path):
    proc = tmp_path / "proc"
    make_proc(proc, 4242, cgroup=SLURM_V2, environ={"SLURM_JOB_USER": "dora"})
    jobmap = tmp_path / "jobmap"
    jobmap.mkdir()
    (jobmap / "1").write_text("slurm:31337\n")
    lib = FakeNvml([FakeGpu("GPU-0", pids=[(4242, 2**30)]), FakeGpu("GPU-1")])
    central, clock = Central(), FakeClock()
    agent = nvml_agent(
        tmp_path, lib, central, clock, attributor=JobAttributor(proc_root=proc, job_map_dir=jobmap)
    )
    agent.run_once()
    agent.close()
    (batch,) = central.batches
    IngestBatch.model_validate(batch)
    procs = {(p["gpu_uuid"], p["pid"], p["job_id"], p["user"]) for p in batch["processes"]}
    assert procs == {("GPU-0", 4242, "slurm:90210", "dora"), ("GPU-1", 0, "slurm:31337", None)}
    assert batch["node"] == {"hostname": "gpu-7", "labels": {"rack": "r9"}}


def test_driver_failure_reinitialises_nvml_with_backoff_not_every_cycle(tmp_path: Path):
    lib = FakeNvml([FakeGpu("GPU-0")])
    central, clock = Central(), FakeClock()
    agent = nvml_agent(
        tmp_path, lib, central, clock, backend_backoff=Backoff(base_seconds=20, cap_seconds=60)
    )
    agent.run_once()
    lib.driver_broken = True
    for _ in range(10):  # 100 s of a broken driver
        clock.advance(10)
        agent.run_once()
    broken_inits = lib.init_calls - 1
    assert 1 <= broken_inits <= 4  # backoff 10-20 s, then 20-40 s, ...: a few tries, not ten
    lib.driver_broken = False
    for _ in range(8):
        clock.advance(10)
        agent.run_once()
    agent.close()
    assert central.batches[-1]["samples"]  # reporting again after the driver came back
    errors = agent.telemetry.registry.get_sample_value(
        "gpuwarden_agent_errors_total", {"kind": "backend"}
    )
    assert errors is not None and errors >= 1


def test_agent_metrics_endpoint_reports_cycles_spool_and_pushes(tmp_path: Path):
    lib = FakeNvml([FakeGpu("GPU-0")])
    central, clock = Central(), FakeClock()
    agent = nvml_agent(tmp_path, lib, central, clock)
    for _ in range(3):
        agent.run_once()
        clock.advance(timedelta(seconds=10).total_seconds())
    port = free_port()
    server = serve_metrics(agent.telemetry, host="127.0.0.1", port=port)
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        server.shutdown()
        server.server_close()
        agent.close()
    assert "gpuwarden_agent_cycle_duration_seconds_count 3.0" in text
    assert "gpuwarden_agent_spool_batches 0.0" in text
    assert "gpuwarden_agent_batches_sent_total 3.0" in text
    assert "gpuwarden_agent_last_successful_push_timestamp_seconds" in text
    assert "gpuwarden_agent_dropped_batches_total 0.0" in text


def test_node_labels_parse_and_bad_ones_are_named():
    assert parse_labels("rack=r1, zone = a,") == {"rack": "r1", "zone": "a"}
    with pytest.raises(ConfigError, match="node_labels: 'oops'"):
        parse_labels("rack=r1,oops")
    at_limits = ",".join(f"{'k' * 61}{i:02d}={'v' * 256}" for i in range(64))
    assert len(parse_labels(at_limits)) == 64
    with pytest.raises(ConfigError, match="at most 64"):
        parse_labels(at_limits + ",one=more")
    with pytest.raises(ConfigError, match="over 63"):
        parse_labels("k" * 64 + "=v")
    with pytest.raises(ConfigError, match="value of 'rack' over 256"):
        parse_labels("rack=" + "v" * 257)


def test_agent_flags_mirror_the_settings():
    args = build_parser().parse_args(
        [
            "agent",
            "--central-url", "https://warden:8000",
            "--agent-token", "gw_x",
            "--interval-seconds", "5",
            "--backend", "dcgm-exporter",
            "--spool-path", "/var/lib/gw/spool.sqlite",
            "--dcgm-exporter-url", "http://localhost:9400/metrics",
            "--node-labels", "rack=r1",
            "--metrics-port", "9105",
        ]
    )  # fmt: skip
    assert args.central_url == "https://warden:8000" and args.interval_seconds == 5.0
    assert args.backend == "dcgm-exporter" and args.agent_metrics_port == 9105


def test_auto_backend_says_what_it_picked(monkeypatch: pytest.MonkeyPatch):
    from service.collectors import runner
    from service.settings import Settings

    monkeypatch.setattr(nvml_mod, "gpu_present", lambda lib=None: False)
    said: list[str] = []
    # `up` and `demo` fall back to a simulated fleet and say so ...
    backend = runner.make_backend(
        Settings(backend="auto"), hostname="ws", say=said.append, simulate_without_gpu=True
    )
    assert backend.name == "simulated"
    assert said == ["backend auto: no NVIDIA GPU found (NVML unavailable): using a simulated fleet"]
    # ... a node agent never ships invented data: it fails, naming the way out.
    with pytest.raises(ConfigError, match=r"no NVIDIA GPU found.*--backend simulated"):
        runner.make_backend(Settings(backend="auto"), hostname="ws", say=said.append)
    assert runner.make_backend(Settings(backend="simulated"), hostname="ws").name == "simulated"
    monkeypatch.setattr(nvml_mod, "gpu_present", lambda lib=None: True)
    monkeypatch.setattr(nvml_mod, "_load_pynvml", lambda: FakeNvml([FakeGpu("GPU-0")]))
    backend = runner.make_backend(Settings(backend="auto"), hostname="ws", say=said.append)
    assert backend.name == "nvml" and said[-1] == "backend auto: NVIDIA GPU found, using NVML"
