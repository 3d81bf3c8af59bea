"""/metrics over real HTTP on SQLite and PostgreSQL: latest sample per GPU, jobs, prices, staleness."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import Engine, insert

from service.context import ServiceContext
from service.db.engine import make_engine
from service.db.schema import prices
from service.settings import Settings
from service.usecases.metrics_endpoint import FleetCollector
from service.vocabulary import DCGM_FIELDS
from tests.integration.metrics_support import add_job, ingest, scrape
from tests.support import FakeClock, auth, make_batch

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"


def test_latest_sample_per_gpu_with_job_and_price(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    start = clock() - timedelta(seconds=50)
    # Five samples 10 s apart; the last one (at now - 10 s) must be the exported value.
    batch = make_batch(gpu_uuids=("GPU-a0", "GPU-a1"), start=start, count=4)
    ingest(http, tokens["agent"], batch)
    last = make_batch(
        gpu_uuids=("GPU-a0", "GPU-a1"),
        start=start + timedelta(seconds=40),
        metrics={"sm_active": 0.02, "fb_used_bytes": 20 * GIB, "power_watts": 123.5},
    )
    ingest(http, tokens["agent"], last)
    add_job(engine, job_id="slurm:42", uuid="GPU-a1", started=start, user="alice", team="vision")
    with engine.begin() as conn:
        conn.execute(
            insert(prices).values(
                model_pattern="*H100*",
                usd_per_gpu_hour=4.0,
                effective_from=datetime(2026, 1, 1, tzinfo=UTC),
            )
        )

    m = scrape(http)
    sm = {labels["gpu_uuid"]: (labels, v) for labels, v in m["gpuwarden_gpu_sm_active_ratio"]}
    assert set(sm) == {"GPU-a0", "GPU-a1"}
    labels, value = sm["GPU-a1"]
    assert value == 0.02
    assert labels == {"node": "node-a", "gpu_index": "1", "gpu_uuid": "GPU-a1", "model": H100}
    # Who holds each GPU: one gpuwarden_gpu_job_info series per GPU, joined on gpu_uuid.
    jobs = {labels["gpu_uuid"]: (labels, v) for labels, v in m["gpuwarden_gpu_job_info"]}
    assert jobs["GPU-a1"] == (
        {
            "node": "node-a",
            "gpu_uuid": "GPU-a1",
            "job_id": "slurm:42",
            "job_node": "node-a",
            "user": "alice",
            "team": "vision",
            "project": "",
        },
        1.0,
    )
    assert jobs["GPU-a0"][0]["job_id"] == ""  # no job: Prometheus treats "" as absent
    assert [v for _, v in m["gpuwarden_gpu_power_watts"]] == [123.5, 123.5]
    assert [v for _, v in m["gpuwarden_gpu_fb_used_bytes"]] == [20 * GIB, 20 * GIB]
    assert m["gpuwarden_fleet_gpus"] == [({}, 2.0)]
    assert m["gpuwarden_fleet_gpus_idle"] == [({}, 2.0)]
    assert m["gpuwarden_fleet_gpus_idle_held"] == [({}, 2.0)]
    # Both GPUs idle now: their whole price is waste.
    assert m["gpuwarden_fleet_waste_usd_per_hour"][0][1] == pytest.approx(2 * 4.0)
    assert "gpuwarden_fleet_wasted_usd_per_hour" not in m
    # The service's own health is on the same page, without _created noise.
    # Every outcome has a series from the start, at 0 until it happens.
    assert sorted(m["gpuwarden_ingest_batches_total"], key=lambda s: s[0]["outcome"]) == [
        ({"outcome": "error"}, 0.0),
        ({"outcome": "refused"}, 0.0),
        ({"outcome": "rejected"}, 0.0),
        ({"outcome": "stored"}, 2.0),
    ]
    assert not [name for name in m if name.endswith("_created")]
    assert m["gpuwarden_fleet_metrics_up"] == [({}, 1.0)]


def test_a_gpu_whose_data_is_late_keeps_its_series_with_its_age_then_drops_out(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock, settings: Settings
):
    ingest(http, tokens["agent"], make_batch(gpu_uuids=("GPU-a0",), start=clock()))
    m = scrape(http)
    assert [v for _, v in m["gpuwarden_gpu_sample_age_seconds"]] == [0.0]
    # Ingest falls behind: past max_gap the GPU is late, not gone (dashboards do not flap).
    clock.advance(settings.max_gap_seconds + 30)
    m = scrape(http)
    assert len(m["gpuwarden_gpu_sm_active_ratio"]) == 1
    assert [v for _, v in m["gpuwarden_gpu_sample_age_seconds"]] == [settings.max_gap_seconds + 30]
    assert m["gpuwarden_fleet_gpus"] == [({}, 1.0)]
    clock.advance(settings.metrics_keep_late_seconds - settings.max_gap_seconds - 30)
    assert len(scrape(http)["gpuwarden_gpu_sm_active_ratio"]) == 1  # exactly the limit: still in
    clock.advance(1)
    m = scrape(http)
    assert "gpuwarden_gpu_sm_active_ratio" not in m
    assert "gpuwarden_gpu_sample_age_seconds" not in m
    assert m["gpuwarden_fleet_gpus"] == [({}, 0.0)]


def test_lost_gpu_is_exported_while_its_node_reports(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    batch = make_batch(gpu_uuids=("GPU-a0", "GPU-a1"), start=clock())
    batch["gpus"][1]["lost"] = True
    batch["samples"] = [s for s in batch["samples"] if s["gpu_uuid"] == "GPU-a0"]
    ingest(http, tokens["agent"], batch)
    m = scrape(http)
    assert m["gpuwarden_gpu_lost"] == [
        ({"node": "node-a", "gpu_index": "1", "gpu_uuid": "GPU-a1", "model": H100}, 1.0)
    ]
    assert m["gpuwarden_fleet_gpus_lost"] == [({}, 1.0)]
    # A lost GPU sends no samples, yet the job holding it is named (GpuLost joins it).
    add_job(engine, job_id="slurm:5", uuid="GPU-a1", started=clock() - timedelta(minutes=1),
            user="bob", team="nlp")  # fmt: skip
    info = {s["gpu_uuid"]: s for s, _ in scrape(http)["gpuwarden_gpu_job_info"]}
    assert info["GPU-a1"] == {"node": "node-a", "gpu_uuid": "GPU-a1", "job_id": "slurm:5",
                              "job_node": "node-a", "user": "bob", "team": "nlp",
                              "project": ""}  # fmt: skip
    assert info["GPU-a0"]["job_id"] == ""


def test_dcgm_compat_adds_dcgm_names(engine: Engine, settings: Settings, clock: FakeClock, tokens):
    from service.api.app import create_app
    from tests.support import live_server

    app = create_app(
        settings.model_copy(update={"metrics_dcgm_compat": True}), engine=engine, clock=clock
    )
    with live_server(app) as url, httpx.Client(base_url=url) as http:
        ingest(http, tokens["agent"], make_batch(start=clock()))
        m = scrape(http)
    assert m["DCGM_FI_PROF_SM_ACTIVE"] == [
        (
            {
                "gpu": "0",
                "UUID": "GPU-a0",
                "device": "nvidia0",
                "modelName": H100,
                "Hostname": "node-a",
                "instance": "node-a",  # per node, kept by the compat scrape job's honor_labels
            },
            0.5,
        )
    ]
    assert m["DCGM_FI_DEV_FB_USED"][0][1] == 1024.0


def test_metrics_can_require_a_reader_token(
    engine: Engine, settings: Settings, clock: FakeClock, tokens
):
    from service.api.app import create_app
    from tests.support import live_server

    app = create_app(
        settings.model_copy(update={"metrics_token_required": True}), engine=engine, clock=clock
    )
    with live_server(app) as url, httpx.Client(base_url=url) as http:
        assert http.get("/metrics").status_code == 401
        assert http.get("/metrics", headers=auth(tokens["agent"])).status_code == 403
        r = http.get("/metrics", headers=auth(tokens["reader"]))
        assert r.status_code == 200
        assert "gpuwarden_fleet_gpus" in r.text


def test_database_failure_gives_up_zero_and_counts_an_error(tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path}/missing/dir/x.db", run_scheduler=False)
    ctx = ServiceContext(settings=settings, engine=make_engine(settings.database_url))
    fams = {f.name: f for f in FleetCollector(ctx).collect()}
    assert fams["gpuwarden_fleet_metrics_up"].samples[0].value == 0.0
    assert "gpuwarden_gpu_sm_active_ratio" not in fams
    assert ctx.telemetry.db_errors.labels("metrics")._value.get() == 1.0


def promtool_check_metrics(text: str) -> tuple[int, list[str]]:
    assert shutil.which("promtool"), "promtool is needed (Debian package prometheus)"
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    return proc.returncode, (proc.stdout + proc.stderr).strip().splitlines()


@pytest.mark.parametrize("dcgm_compat", [False, True])
def test_promtool_finds_no_problem_in_the_exposition(
    engine: Engine, settings: Settings, clock: FakeClock, tokens, dcgm_compat: bool
):
    from service.api.app import create_app
    from tests.support import live_server

    app = create_app(
        settings.model_copy(update={"metrics_dcgm_compat": dcgm_compat}), engine=engine, clock=clock
    )
    with live_server(app) as url, httpx.Client(base_url=url) as http:
        metrics = {
            "sm_active": 0.5,
            "gpu_util": 1.0,
            "fb_used_bytes": GIB,
            "energy_joules": 1e6,
            "xid_last": 0,
            "sm_clock_hz": 1.98e9,
            "nvlink_tx_bytes_per_second": 1e9,
        }
        ingest(http, tokens["agent"], make_batch(start=clock(), metrics=metrics))
        add_job(engine, job_id="j1", uuid="GPU-a0", started=clock(), user="u", team="t")
        text = http.get("/metrics").text
    assert "gpuwarden_gpu_energy_joules_total" in text
    rc, problems = promtool_check_metrics(text)
    if not dcgm_compat:
        assert rc == 0 and problems == [], problems
    else:
        # dcgm-exporter's own label names (UUID, modelName, Hostname) are camelCase, and its
        # counters (TOTAL_ENERGY_CONSUMPTION ...) have no _total; keeping both is the point of
        # the compat mode, and they are the only things promtool may object to.
        assert "DCGM_FI_PROF_SM_ACTIVE" in text
        assert problems, "promtool should notice dcgm-exporter's camelCase labels"
        counters = {f.name for f in DCGM_FIELDS if f.prom_type == "counter"}
        for line in problems:
            name = line.split(" ", 1)[0]
            camel = "camelCase" in line
            total = name in counters and 'should have "_total" suffix' in line
            assert line.startswith("DCGM_FI_") and (camel or total), line
