"""Scenarios with a real Alertmanager (/usr/bin/prometheus-alertmanager, Debian package
prometheus-alertmanager) on loopback on free ports and a real central service with an
`alertmanager` channel evaluating every second.

1. A hot GPU: Alertmanager's own API (`GET /api/v2/alerts`) shows the alert with our labels and
   annotations; it is re-sent while firing (endsAt keeps moving forward, as Alertmanager expects of
   a Prometheus-like sender); when the GPU cools, the resolved alert leaves the active list.
2. The shipped deploy/alertmanager/alertmanager.yml (only its receiver pointed at a loopback
   webhook and its waits shortened): two jobs' low-activity alerts arrive as two notifications,
   one per job, and a gpu-hardware-fault alert inhibits the idle-held-gpu alert of the same GPU.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import Engine

from tests.alerting_support import (
    add_job,
    auth,
    ingest,
    low_sm_policy,
    running_service,
    wait_until,
)
from tests.conftest import make_token
from tests.receivers import Receiver
from tests.support import free_port, make_batch

AM_BINARY = "/usr/bin/prometheus-alertmanager"
SHIPPED_AM_CONFIG = Path(__file__).parents[2] / "deploy" / "alertmanager" / "alertmanager.yml"
PROMTOOL_TESTS = Path(__file__).parents[2] / "deploy/prometheus/tests/gpuwarden-alerts.test.yml"
AM_CONFIG = """\
route:
  receiver: blackhole
  group_wait: 1s
receivers:
  - name: blackhole
"""


@contextmanager
def run_alertmanager(tmp_path: Path, config: str) -> Iterator[str]:
    """A real Alertmanager with ``config`` on a free loopback port; yields its base URL."""
    (tmp_path / "am.yml").write_text(config)
    port = free_port()
    proc = subprocess.Popen(
        [
            AM_BINARY,
            f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("alertmanager did not start")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager that routes everything nowhere; yields its base URL."""
    with run_alertmanager(tmp_path, AM_CONFIG) as url:
        yield url


def am_channel(engine: Engine, http: httpx.Client, am: str) -> tuple[dict[str, str], str]:
    """Admin headers and an agent token of node-a, after making channel "am" post to ``am``."""
    admin = auth(make_token(engine, "admin"))
    agent = make_token(engine, "agent", "node-a")
    channel = {"name": "am", "type": "alertmanager", "url": am}
    assert http.post("/api/v1/channels", json=channel, headers=admin).status_code == 201
    return admin, agent


def hot_gpu_policy(severity: str) -> dict[str, object]:
    """Policy "hot-gpu": a GPU above 85 C over 5 s fires at once, to channel "am"."""
    return {
        "name": "hot-gpu", "metric": "temperature_celsius", "aggregate": "avg",
        "window": "5s", "op": ">", "threshold": 85, "for": "0s", "scope": "gpu",
        "severity": severity, "channels": ["am"],
    }  # fmt: skip


def report_hot(http: httpx.Client, agent: str) -> None:
    """One sample of GPU-a0 at 91 C, a second ago."""
    now = datetime.now(UTC) - timedelta(seconds=1)
    ingest(http, agent, start=now, count=1, metrics={"temperature_celsius": 91.0})


def am_alerts(am: str) -> list[dict]:  # type: ignore[type-arg]
    r = httpx.get(am + "/api/v2/alerts", params={"filter": 'alertname="hot-gpu"'}, timeout=5)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def test_hot_gpu_alert_lives_in_alertmanager(engine, alertmanager: str) -> None:
    with (
        running_service(engine, alertmanager_resend_seconds=1.0) as (url, _ctx),
        httpx.Client(base_url=url) as http,
    ):
        admin, agent = am_channel(engine, http, alertmanager)
        policy = {**hot_gpu_policy("warning"), "description": "GPU core above 85 C"}
        assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201
        ingest(
            http,
            agent,
            start=datetime.now(UTC) - timedelta(seconds=2),
            count=1,
            metrics={"temperature_celsius": 91.0, "sm_active": 0.9},
        )

        (alert,) = wait_until(lambda: am_alerts(alertmanager), timeout=20)
        labels = alert["labels"]
        assert labels["alertname"] == "hot-gpu" and labels["severity"] == "warning"
        assert labels["gpu_uuid"] == "GPU-a0" and labels["node"] == "node-a"
        assert labels["gpu_index"] == "0" and labels["policy"] == "hot-gpu"
        assert "job" not in labels and "gpu" not in labels
        assert alert["annotations"]["summary"] == "[FIRING] hot-gpu on node-a GPU 0 (GPU-a0)"
        assert "avg temperature_celsius over 5s = 91" in alert["annotations"]["description"]
        assert alert["status"]["state"] == "active"
        ends_first = alert["endsAt"]

        # Re-sent while firing: Alertmanager sees endsAt move forward.
        def moved() -> bool:
            current = am_alerts(alertmanager)
            return bool(current) and current[0]["endsAt"] > ends_first

        for _ in range(6):
            ingest(
                http,
                agent,
                start=datetime.now(UTC),
                count=1,
                metrics={"temperature_celsius": 91.0, "sm_active": 0.9},
            )
            if moved():
                break
            time.sleep(1)
        assert moved()

        # It cools down: the resolved alert leaves Alertmanager's active list.
        for _ in range(15):
            ingest(
                http,
                agent,
                start=datetime.now(UTC),
                count=1,
                metrics={"temperature_celsius": 60.0, "sm_active": 0.9},
            )
            if not am_alerts(alertmanager):
                break
            time.sleep(1)
        assert am_alerts(alertmanager) == []
        (ours,) = http.get("/api/v1/alerts", params={"policy": "hot-gpu"}, headers=admin).json()
        assert ours["state"] == "resolved"


def shipped_config(receiver_url: str) -> str:
    """The shipped alertmanager.yml with its receiver pointed at ``receiver_url``, waits short."""
    doc = yaml.safe_load(SHIPPED_AM_CONFIG.read_text())
    doc["route"] |= {"group_wait": "1s", "group_interval": "1s"}
    doc["receivers"] = [
        {"name": "default", "webhook_configs": [{"url": receiver_url, "send_resolved": False}]}
    ]
    return yaml.safe_dump(doc)


def gpu_policy(name: str, metric: str, aggregate: str, severity: str) -> dict[str, object]:
    return {
        "name": name,
        "metric": metric,
        "aggregate": aggregate,
        "window": "10s",
        "op": ">=",
        "threshold": 1,
        "for": "0s",
        "scope": "gpu",
        "severity": severity,
        "channels": ["am"],
    }


def test_shipped_config_groups_per_job_and_inhibits_idle_on_a_faulty_gpu(
    engine, tmp_path: Path
) -> None:
    receiver = Receiver()
    with (
        run_alertmanager(tmp_path, shipped_config(receiver.url + "/am")) as am,
        # A long resend keeps each alert's endsAt minutes ahead, as in production.
        running_service(engine, alertmanager_resend_seconds=60.0) as (url, _ctx),
        httpx.Client(base_url=url) as http,
    ):
        admin, agent = am_channel(engine, http, am)

        def report(xid: int | None = None) -> None:
            now = datetime.now(UTC) - timedelta(seconds=1)
            idle: dict[str, float] = {"sm_active": 0.0, "fb_used_bytes": 2 << 30}
            if xid is not None:  # an interval without an XID has no xid_last at all
                idle["xid_last"] = xid
            ingest(http, agent, start=now, count=1, metrics=idle, gpu_uuids=("GPU-a0",))
            busy = {"sm_active": 0.1, "fb_used_bytes": 8 << 30}
            ingest(http, agent, start=now, count=1, metrics=busy, gpu_uuids=("GPU-a1", "GPU-a2"))

        report()
        started = datetime.now(UTC) - timedelta(minutes=1)
        add_job(engine, "slurm:101", ("GPU-a1",), started_at=started, user="alice")
        add_job(engine, "slurm:102", ("GPU-a2",), started_at=started, user="bob")
        for policy in (
            gpu_policy("idle-held-gpu", "idle_held", "min", "warning"),
            gpu_policy("gpu-hardware-fault", "hardware_fault", "max", "critical"),
            {
                "name": "low-sm-activity",
                "metric": "sm_active",
                "aggregate": "avg",
                "window": "10s",
                "op": "<",
                "threshold": 0.3,
                "for": "0s",
                "scope": "job",
                "channels": ["am"],
            },
        ):
            assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201
        report()  # fresh samples inside the 10 s windows, however long the set-up took

        def alerts(policy: str) -> list[dict]:  # type: ignore[type-arg]
            r = httpx.get(am + "/api/v2/alerts", params={"filter": f'policy="{policy}"'}, timeout=5)
            r.raise_for_status()
            return r.json()  # type: ignore[no-any-return]

        def job_groups() -> list[dict] | None:  # type: ignore[type-arg]
            groups = [
                m.json()
                for m in receiver.received
                if m.json()["commonLabels"].get("policy") == "low-sm-activity"
            ]
            return groups if len(groups) >= 2 else None

        # Job alerts group per job: two notifications, one alert each.
        groups = wait_until(job_groups, timeout=30, every=0.5)
        by_job = {g["groupLabels"]["job_id"]: [a["labels"] for a in g["alerts"]] for g in groups}
        assert set(by_job) == {"slurm:101", "slurm:102"}
        assert [a["user"] for a in by_job["slurm:101"]] == ["alice"]
        assert [a["user"] for a in by_job["slurm:102"]] == ["bob"]
        (idle,) = wait_until(lambda: alerts("idle-held-gpu"), timeout=20)
        assert idle["labels"]["gpu_uuid"] == "GPU-a0" and idle["status"]["state"] == "active"

        # An XID on that GPU: the hardware alert inhibits the idle one of the same GPU only.
        report(xid=79)
        (fault,) = wait_until(lambda: alerts("gpu-hardware-fault"), timeout=20)
        assert fault["labels"]["gpu_uuid"] == "GPU-a0" and fault["labels"]["severity"] == "critical"

        def inhibited() -> dict | None:  # type: ignore[type-arg]
            (alert,) = alerts("idle-held-gpu")
            return alert if alert["status"]["inhibitedBy"] else None

        idle = wait_until(inhibited, timeout=20, every=0.5)
        assert idle["status"]["state"] == "suppressed"
        assert all(a["status"]["state"] == "active" for a in alerts("low-sm-activity"))


def test_a_firing_alert_keeps_its_labels_in_alertmanager_after_its_job_ends(
    engine, alertmanager: str
) -> None:
    """A GPU alert fired while job slurm:7 held the GPU; the job ends, the GPU stays hot.
    Alertmanager must keep seeing the label set it fired with: a new label set would let the
    old one expire into "resolved" while the service still says firing."""
    with (
        running_service(engine, alertmanager_resend_seconds=1.0) as (url, _ctx),
        httpx.Client(base_url=url) as http,
    ):
        admin, agent = am_channel(engine, http, alertmanager)
        policy = hot_gpu_policy("critical")
        assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201

        report_hot(http, agent)
        add_job(engine, "slurm:7", ("GPU-a0",), started_at=datetime.now(UTC) - timedelta(minutes=1))
        report_hot(http, agent)
        (fired,) = wait_until(lambda: am_alerts(alertmanager), timeout=20)
        assert fired["labels"]["job_id"] == "slurm:7"
        ended = {"ended_at": datetime.now(UTC).isoformat()}
        assert http.patch("/api/v1/jobs/slurm:7", json=ended, headers=admin).status_code == 200

        # Keep it hot past the endsAt that Alertmanager held for the fired label set: had the
        # service sent another label set since, that one would have expired by then.
        first_ends = datetime.fromisoformat(fired["endsAt"])

        def past_first_ends() -> bool:
            report_hot(http, agent)
            return datetime.now(UTC) > first_ends + timedelta(seconds=1)

        wait_until(past_first_ends, timeout=60, every=1.0)
        current = am_alerts(alertmanager)
        assert [a["labels"].get("job_id") for a in current] == ["slurm:7"], current
        assert current[0]["fingerprint"] == fired["fingerprint"]
        assert current[0]["status"]["state"] == "active"
        (ours,) = http.get("/api/v1/alerts", params={"policy": "hot-gpu"}, headers=admin).json()
        assert ours["state"] == "firing" and ours["labels"]["job_id"] == "slurm:7"


def test_shipped_config_groups_rule_and_native_alerts_of_one_policy_and_job(
    tmp_path: Path,
) -> None:
    # The same trouble seen twice - by the shipped Prometheus rule GpuIdleHeld and by the
    # native idle-held-gpu policy (alertname = the policy's name, as notify/alertmanager.py
    # sends it) - is one notification; the service's own alerts, which carry no policy, stay
    # grouped per alertname.
    where = {
        "policy": "idle-held-gpu",
        "severity": "warning",
        "job_id": "slurm:8001",
        "node": "node-a",
        "gpu_uuid": "GPU-1",
        "gpu_index": "0",
        "user": "alice",
        "team": "vision",
    }
    # GpuLost and GpuJobLowSmActivity as promtool's run of the shipped rules labels them
    # (deploy/prometheus/tests), beside the native alerts as the service labels them: a GPU
    # alert with its holder's job, a job alert with every node of the job, comma-joined.
    lost = rule_alert_labels("GpuLost", job_id="slurm:4")
    low = rule_alert_labels("GpuJobLowSmActivity", job_id="slurm:3")
    assert low["node"] == "n1,n2"  # a job on two nodes
    gpu_of_job = {"gpu_uuid": "GPU-J", "gpu_index": "1", "model": "A100"}
    job_gpus = {"gpu_uuid": "GPU-0,GPU-9", "gpu_index": "n1:0,n2:0", "model": "H100"}
    sent = [
        {"alertname": "GpuIdleHeld", **where},
        {"alertname": "idle-held-gpu", **where},
        lost,
        {"alertname": "gpu-hardware-fault", "policy": "gpu-hardware-fault",
         "severity": "critical", "node": "n2", "job_id": "slurm:4", "user": "dan",
         "team": "vision", "project": "p", **gpu_of_job},
        low,
        {"alertname": "low-sm-activity", "policy": "low-sm-activity", "severity": "warning",
         "job_id": "slurm:3", "node": "n1,n2", "user": "carol", "team": "nlp", **job_gpus},
        {"alertname": "GpuWardenDown", "severity": "critical"},
        {"alertname": "GpuWardenDatabaseErrors", "severity": "warning"},
    ]  # fmt: skip
    receiver = Receiver()
    with run_alertmanager(tmp_path, shipped_config(receiver.url + "/am")) as am:
        r = httpx.post(am + "/api/v2/alerts", json=[{"labels": labels} for labels in sent])
        assert r.status_code == 200, r.text

        def groups() -> list[set[str]] | None:
            got = httpx.get(am + "/api/v2/alerts/groups").json()
            names = [{a["labels"]["alertname"] for a in g["alerts"]} for g in got]
            return names if sum(map(len, names)) == len(sent) else None

        got = wait_until(groups, timeout=30, every=0.2)
        assert sorted(got, key=sorted) == [
            {"GpuIdleHeld", "idle-held-gpu"},
            {"GpuJobLowSmActivity", "low-sm-activity"},
            {"GpuLost", "gpu-hardware-fault"},
            {"GpuWardenDatabaseErrors"},
            {"GpuWardenDown"},
        ]


def rule_alert_labels(alertname: str, **where: str) -> dict[str, str]:
    """The labels promtool's run of the shipped rules expects of ``alertname``'s alert whose
    labels include ``where`` (from deploy/prometheus/tests), with its alertname."""
    doc = yaml.safe_load(PROMTOOL_TESTS.read_text())
    (labels,) = [
        alert["exp_labels"]
        for case in doc["tests"]
        for check in case.get("alert_rule_test", [])
        if check["alertname"] == alertname
        for alert in check["exp_alerts"]
        if where.items() <= alert["exp_labels"].items()
    ]
    return {"alertname": alertname, **{k: str(v) for k, v in labels.items()}}


# Alertmanager telling its receivers every state change, resolved ones included, at once.
NOTIFY_ALL_CONFIG = """\
route:
  receiver: hook
  group_by: ["alertname"]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {url}
        send_resolved: true
"""


def keep_muted_past_expiry(
    am: str, policy: str, report: Callable[[], None], receiver: Receiver
) -> dict:  # type: ignore[type-arg]
    """Report for several expiry periods (endsAt - now when muting began) while the alert is
    muted in GPU Warden; Alertmanager must hold it active, never resolved. Returns the alert."""
    (alert,) = alerts_of(am, policy)
    first_ends = datetime.fromisoformat(alert["endsAt"])

    def past() -> bool:
        report()
        return datetime.now(UTC) > first_ends + timedelta(seconds=4)

    wait_until(past, timeout=60, every=1.0)
    (alert,) = alerts_of(am, policy)
    assert alert["status"]["state"] == "active"
    assert [m.json()["status"] for m in receiver.received] == ["firing"]
    return alert


@contextmanager
def notify_all_am(
    engine: Engine, tmp_path: Path, receiver: Receiver
) -> Iterator[tuple[httpx.Client, str, dict[str, str], str]]:
    """A service sending to channel "am", a real Alertmanager that notifies ``receiver`` of every
    alert: (client of the service, Alertmanager's URL, admin headers, agent token of node-a).

    Alerts are re-sent every second, so endsAt is 4 s ahead: a muted alert not re-sent expires
    within 4 s.
    """
    with (
        run_alertmanager(tmp_path, NOTIFY_ALL_CONFIG.format(url=receiver.url + "/am")) as am,
        running_service(engine, alertmanager_resend_seconds=1.0) as (url, _ctx),
        httpx.Client(base_url=url) as http,
    ):
        admin, agent = am_channel(engine, http, am)
        yield http, am, admin, agent


def alerts_of(am: str, policy: str) -> list[dict]:  # type: ignore[type-arg]
    r = httpx.get(am + "/api/v2/alerts", params={"filter": f'policy="{policy}"'}, timeout=5)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def test_a_silence_in_gpu_warden_never_reaches_alertmanager_as_a_resolution(
    engine, tmp_path: Path
) -> None:
    receiver = Receiver()
    with notify_all_am(engine, tmp_path, receiver) as (http, am, admin, agent):
        policy = hot_gpu_policy("warning")
        assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201

        report_hot(http, agent)
        (fired,) = wait_until(lambda: alerts_of(am, "hot-gpu"), timeout=20)
        wait_until(lambda: receiver.received, timeout=20)
        assert "gpuwarden_muted" not in fired["annotations"]

        silence = {"matchers": {"policy": "hot-gpu"}, "comment": "maintenance",
                   "ends_at": (datetime.now(UTC) + timedelta(hours=1)).isoformat()}  # fmt: skip
        r = http.post("/api/v1/silences", json=silence, headers=admin)
        assert r.status_code == 201, r.text
        muted = keep_muted_past_expiry(am, "hot-gpu", lambda: report_hot(http, agent), receiver)
        # The same alert (label set, start), marked as muted here; still firing in GPU Warden.
        assert muted["fingerprint"] == fired["fingerprint"]
        assert muted["startsAt"] == fired["startsAt"]
        assert muted["annotations"]["gpuwarden_muted"] == "silenced"
        (ours,) = http.get("/api/v1/alerts", params={"policy": "hot-gpu"}, headers=admin).json()
        assert ours["state"] == "firing" and ours["silenced"]

        # Deleting the silence changes nothing in Alertmanager's view but the annotation.
        assert http.delete(f"/api/v1/silences/{r.json()['id']}", headers=admin).status_code == 204

        def unmuted() -> dict | None:  # type: ignore[type-arg]
            report_hot(http, agent)
            (alert,) = alerts_of(am, "hot-gpu")
            return None if "gpuwarden_muted" in alert["annotations"] else alert

        back = wait_until(unmuted, timeout=20, every=1.0)
        assert (back["fingerprint"], back["startsAt"]) == (fired["fingerprint"], fired["startsAt"])
        time.sleep(3)  # a group_interval and more: a "new" alert would be notified by now
        assert [m.json()["status"] for m in receiver.received] == ["firing"]


def test_a_job_alert_suppressed_by_a_lost_gpu_stays_firing_in_alertmanager(
    engine, tmp_path: Path
) -> None:
    receiver = Receiver()
    with notify_all_am(engine, tmp_path, receiver) as (http, am, admin, agent):

        def report(lost: bool = False) -> None:
            batch = make_batch(
                gpu_uuids=("GPU-a0",),
                start=datetime.now(UTC) - timedelta(seconds=1),
                metrics={"sm_active": 0.05, "fb_used_bytes": 8 << 30},
            )
            batch["gpus"][0]["lost"] = lost
            if lost:  # a lost GPU answers nothing: the node reports it without samples
                batch["samples"] = []
            r = http.post("/api/v1/ingest", json=batch, headers=auth(agent))
            assert r.status_code == 200, r.text

        report()
        add_job(engine, "slurm:5", ("GPU-a0",), started_at=datetime.now(UTC) - timedelta(minutes=1))
        policy = low_sm_policy(["am"], window="5s")
        assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201
        report()
        (fired,) = wait_until(lambda: alerts_of(am, "low-sm-activity"), timeout=20)
        # A native job alert names the job's node(s): GpuJobLowSmActivity must say the same.
        assert fired["labels"]["job_id"] == "slurm:5" and fired["labels"]["node"] == "node-a"
        wait_until(lambda: receiver.received, timeout=20)

        muted = keep_muted_past_expiry(am, "low-sm-activity", lambda: report(lost=True), receiver)
        assert muted["fingerprint"] == fired["fingerprint"]
        assert muted["annotations"]["gpuwarden_muted"] == "suppressed"
        (ours,) = http.get(
            "/api/v1/alerts", params={"policy": "low-sm-activity"}, headers=admin
        ).json()
        assert ours["state"] == "firing" and ours["suppressed"]
