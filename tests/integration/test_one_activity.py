"""One definition of activity, idle and idle-held: the cost model, the /metrics families and
the alert windows (short, from raw samples; long, from rollups) agree on every source, and
the shipped default policies fire on a GPU that reports only gr_engine_active."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, select

from service.context import ServiceContext
from service.db import gpus_repo, metrics_repo, windows_repo
from service.db.schema import alerts, gpus, outbox
from service.exposition.fleet import fleet_families
from service.settings import Settings
from service.usecases import ingest as ingest_service
from service.usecases.costing.cost_report import cost_report
from service.usecases.evaluation import evaluate_once, load_config
from service.wire import IngestBatch
from tests.alerting_support import add_job
from tests.integration.cost_data import GIB, roll_up
from tests.support import FakeClock, iso

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=2)
HELD = 20 * GIB
SKEW = 300.0  # the default ingest_max_future_seconds

# (source, metrics while busy at 0.8 activity, metrics while idle holding memory, rung)
SOURCES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "gpm": (
        {"sm_active": 0.8, "gr_engine_active": 0.9, "gpu_util": 1.0, "tensor_active": 0.6,
         "fb_used_bytes": HELD},
        {"sm_active": 0.0, "gr_engine_active": 0.0, "gpu_util": 0.0, "tensor_active": 0.0,
         "fb_used_bytes": HELD},
        "sm_active",
    ),
    # Stock dcgm-exporter on a MIG instance: GR_ENGINE_ACTIVE, no SM_ACTIVE, no GPU_UTIL.
    "dcgm": (
        {"gr_engine_active": 0.8, "fb_used_bytes": HELD},
        {"gr_engine_active": 0.0, "fb_used_bytes": HELD},
        "gr_engine_active",
    ),
    # A GPU without GPM: the coarse duty cycle only.
    "nvml": (
        {"gpu_util": 0.8, "fb_used_bytes": HELD},
        {"gpu_util": 0.0, "fb_used_bytes": HELD},
        "gpu_util",
    ),
}  # fmt: skip


def context(engine: Engine, clock: FakeClock, **kw: Any) -> ServiceContext:
    settings = Settings(
        database_url=str(engine.url.render_as_string(hide_password=False)),
        run_scheduler=False,
        **kw,
    )
    return ServiceContext(settings=settings, engine=engine, clock=clock)


def store_two_hours(ctx: ServiceContext, source: str) -> None:
    """An hour at activity 0.8, then an hour idle holding 20 GiB, every 10 s, in a job."""
    busy, idle, _ = SOURCES[source]
    samples = [
        {"gpu_uuid": "GPU-x", "ts": iso(T0 + timedelta(seconds=10 * k)), "source": source,
         "metrics": busy if k < 360 else idle}
        for k in range(720)
    ]  # fmt: skip
    batch = {
        "node": {"hostname": "node-a", "labels": {}},
        "gpus": [{"uuid": "GPU-x", "index": 0, "model": "NVIDIA H100 80GB HBM3"}],
        "samples": samples,
    }
    ingest_service.ingest(ctx, IngestBatch.model_validate(batch), token_node="node-a")
    roll_up(ctx.engine, ctx.thresholds)
    add_job(ctx.engine, "j1", ("GPU-x",), started_at=T0)


def family_values(ctx: ServiceContext) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with ctx.engine.connect() as conn:
        snapshot = metrics_repo.read_fleet(
            conn, now=NOW, max_age_seconds=60, start_skew_seconds=SKEW
        )
    out = {}
    for fam in fleet_families(snapshot, thresholds=ctx.thresholds, now=NOW):
        for s in fam.samples:
            keep = tuple(sorted((k, v) for k, v in s.labels.items() if k in ("rung", "cause")))
            out[(s.name, keep)] = s.value
    return out


@pytest.mark.parametrize("source", list(SOURCES))
def test_cost_model_metrics_and_alert_windows_agree(
    engine: Engine, clock: FakeClock, source: str
) -> None:
    clock.set(NOW)
    ctx = context(engine, clock)
    store_two_hours(ctx, source)
    rung = SOURCES[source][2]

    with engine.connect() as conn:
        gpu_id = conn.execute(select(gpus.c.id)).scalar_one()
        report = {
            w: cost_report(
                conn, settings=ctx.settings, start=NOW - timedelta(seconds=w), end=NOW,
                now=NOW, group_by="job",
            )["totals"]
            for w in (300, 7200)
        }  # fmt: skip
        stats = windows_repo.window_stats(
            conn,
            windows={300.0: ["activity", "idle_held"], 7200.0: ["activity", "idle_held"]},
            now=NOW,
            gpu_ids=[gpu_id],
        )

    # The cost model: the second hour is idle-held, every second of it, on every source.
    long = report[7200]
    assert long["allocated_seconds"] == pytest.approx(7200)
    assert long["idle_seconds"] == pytest.approx(3600)
    assert long["idle_held_seconds"] == pytest.approx(3600)
    assert long["unused_seconds"] == pytest.approx(3600 + 0.2 * 3600)
    assert long["causes"]["idle_held"]["seconds"] == pytest.approx(3600)
    assert sum(c["seconds"] for c in long["causes"].values()) == pytest.approx(7200)

    # The alert windows (5m from raw samples, 2h from 1m rollups) say the same.
    for w, row in report.items():
        per = stats[float(w)][gpu_id]
        share = row["idle_held_seconds"] / row["allocated_seconds"]
        assert per["idle_held"].sum / per["idle_held"].count == pytest.approx(share), w
        assert per["activity"].sum / per["activity"].count == pytest.approx(
            row["efficiency"], abs=1e-9
        ), w
    assert stats[300.0][gpu_id]["idle_held"].min == 1.0  # the default policy's aggregate

    # The API: the latest sample's activity, rung and cause, and the causes the GPU supports.
    with engine.connect() as conn:
        (gpu,) = gpus_repo.list_gpus(conn, now=NOW, start_skew_seconds=SKEW)
    assert (gpu["activity"], gpu["activity_rung"], gpu["cause"]) == (0.0, rung, "idle_held")
    if source == "nvml":  # the coarse duty cycle only: it cannot say why a busy GPU is busy
        assert gpu["supported_causes"] == ["idle_empty", "idle_held"]
    if source == "gpm":
        assert {"launch_bound", "compute_tensor"} <= set(gpu["supported_causes"])

    # /metrics: idle-held now, activity 0 on the source's rung.
    fams = family_values(ctx)
    assert fams[("gpuwarden_gpu_idle", ())] == 1.0
    assert fams[("gpuwarden_fleet_gpus_idle", ())] == 1.0
    assert fams[("gpuwarden_fleet_gpus_idle_held", ())] == 1.0
    assert fams[("gpuwarden_gpu_activity_ratio", (("rung", rung),))] == 0.0
    assert fams[("gpuwarden_gpu_cause", (("cause", "idle_held"),))] == 1.0
    assert fams[("gpuwarden_fleet_gpus_by_cause", (("cause", "idle_held"),))] == 1.0
    # No price for this model in the test database: nothing is counted in dollars.
    assert fams[("gpuwarden_fleet_cause_usd_per_hour", (("cause", "idle_held"),))] == 0.0


@pytest.mark.parametrize("source", ["dcgm", "nvml"])
def test_default_policies_fire_on_a_gpu_without_sm_active(
    engine: Engine, clock: FakeClock, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T0/B0/X")
    monkeypatch.setenv("GPUWARDEN_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    clock.set(NOW)
    ctx = context(engine, clock, config=ROOT / "deploy/examples/gpuwarden.yaml")
    store_two_hours(ctx, source)
    load_config(ctx)
    t = T0 + timedelta(minutes=62)
    while t <= NOW:
        clock.set(t)
        evaluate_once(ctx)
        t += timedelta(minutes=2)
    with engine.connect() as conn:
        firing = {r.policy for r in conn.execute(select(alerts).where(alerts.c.state == "firing"))}
    assert {"idle-held-gpu", "low-sm-activity"} <= firing


def _actions_doc_policy() -> dict[str, Any]:
    """The first policy of docs/actions.md (idle-held-job, with its ladder), as a user adds it."""
    text = (ROOT / "docs/actions.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    (policy,) = yaml.safe_load(block)["policies"]
    assert isinstance(policy, dict)
    return policy


@pytest.mark.parametrize(
    ("idle_metrics", "with_doc_policy", "alerted"),
    [
        # An hour of work, then an hour holding 20 GiB with nothing running.
        (SOURCES["gpm"][1], False, "idle-held-gpu"),
        # The same with docs/actions.md's job policy beside the defaults: its job alert says it.
        (SOURCES["gpm"][1], True, "idle-held-job"),
        # An hour of work, then an hour with nothing running and nothing held.
        ({"sm_active": 0.0, "gr_engine_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 0},
         False, "allocated-idle-gpu"),
    ],
)  # fmt: skip
def test_one_idle_job_raises_one_alert(
    engine: Engine,
    clock: FakeClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    idle_metrics: dict[str, Any],
    with_doc_policy: bool,
    alerted: str,
) -> None:
    monkeypatch.setenv("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T0/B0/X")
    monkeypatch.setenv("GPUWARDEN_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    config = yaml.safe_load((ROOT / "deploy/examples/gpuwarden.yaml").read_text())
    if with_doc_policy:
        config["policies"].append(_actions_doc_policy())
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(yaml.safe_dump(config))
    clock.set(NOW)
    ctx = context(engine, clock, config=path)
    monkeypatch.setitem(SOURCES, "gpm", (SOURCES["gpm"][0], idle_metrics, "sm_active"))
    store_two_hours(ctx, "gpm")
    load_config(ctx)
    t = T0 + timedelta(minutes=61)
    while t <= NOW:
        clock.set(t)
        evaluate_once(ctx)
        t += timedelta(minutes=1)
    with engine.connect() as conn:
        rows = conn.execute(select(alerts).where(alerts.c.state == "firing")).all()
        payloads = conn.execute(select(outbox.c.payload)).scalars().all()
        firing_notes = {p["policy"] for p in payloads if p["kind"] == "firing"}
    assert {r.policy for r in rows if not r.suppressed} == {alerted}
    assert "low-sm-activity" in {r.policy for r in rows}  # kept, muted: the idle alert says it
    assert firing_notes == {alerted}  # one notification of one alert
