"""A Kubernetes node whose pods share GPUs, through the real agent and the real central: a whole
GPU time-sliced by three pods, and a MIG GPU with one instance held by one pod and one instance
time-sliced by two. Every pod gets its own report row, the pods of a GPU split its cost by the
site's rule, MIG instances are priced as slices of the parent, and the pods' dollars add up to
the GPUs' to the cent.

The agent reads the fake NVML and asks the fake kubelet (real gRPC); its polls are built into
wire batches exactly as it ships them and go through central's ingest, rollup and cost report.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, insert, select

from service.collectors.agent import Agent, AgentConfig
from service.collectors.batch import build_batch
from service.collectors.dcgm_exporter import DcgmExporterBackend
from service.collectors.shipper import Shipper
from service.collectors.spool import Spool
from service.context import ServiceContext
from service.core.diagnosis import Cause
from service.costs.integrals import Thresholds
from service.costs.tenants import SplitRule
from service.db import observed_jobs_repo, rollup_repo
from service.db.schema import gpu_processes, job_gpus, prices, samples, tenant_1m
from service.settings import Settings
from service.usecases import ingest as ingest_service
from service.usecases.costing.cost_report import cost_report
from service.wire import IngestBatch
from tests.fake_nvml import FakeGpu
from tests.kubelet_fake import node_agent, pod, write_proc
from tests.support import FakeClock, iso

GIB = 2**30
WHOLE = "GPU-5d3f6a2c-7b1e-4c9a-9e0f-1a2b3c4d5e6f"
PARENT = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
INST_C = "MIG-c0000001-0000-0000-0000-000000000000"
INST_DE = "MIG-de000002-0000-0000-0000-000000000000"
USD_PER_HOUR = 7.0  # an H100; a 3g.40gb instance is 3/7 of it: $3/h
MINUTES = 30
STEP_SECONDS = 10
NODE = "gpu-node-3"


def node_gpus() -> list[FakeGpu]:
    whole = FakeGpu(WHOLE, name="NVIDIA H100 80GB HBM3", pids=[(4001, 6 * GIB), (4002, 2 * GIB)])
    inst_c = FakeGpu(
        INST_C, name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", gpu_instance_id=1, pids=[(5001, GIB)]
    )
    inst_de = FakeGpu(
        INST_DE, name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", gpu_instance_id=2, pids=[(5002, GIB)]
    )
    parent = FakeGpu(PARENT, name="NVIDIA H100 80GB HBM3", migs=[inst_c, inst_de])
    return [whole, parent]


PODS = [
    pod("trainer", "nvidia.com/gpu", f"{WHOLE}::0"),
    pod("notebook", "nvidia.com/gpu", f"{WHOLE}::1"),
    pod("idle", "nvidia.com/gpu", f"{WHOLE}::2"),  # holds a replica, runs nothing
    pod("slice-c", "nvidia.com/mig-3g.40gb", INST_C),
    pod("slice-d", "nvidia.com/mig-3g.40gb", f"{INST_DE}::0"),
    pod("slice-e", "nvidia.com/mig-3g.40gb", f"{INST_DE}::1"),  # runs nothing
]
POD_JOBS = {f"k8s:ml/{p.name}" for p in PODS}


def ship(engine: Engine, clock: FakeClock, agent: Agent, node: str) -> None:
    """Thirty minutes of ``agent``'s polls, through central's ingest as the agent ships them."""
    ctx = ServiceContext(
        settings=Settings(database_url="sqlite://", run_scheduler=False), engine=engine, clock=clock
    )
    t0 = clock() - timedelta(minutes=MINUTES + 5)
    snaps = []
    for k in range(MINUTES * 60 // STEP_SECONDS):
        snap = agent.poll(t0 + timedelta(seconds=k * STEP_SECONDS))
        assert snap is not None
        snaps.append(snap)
    for i in range(0, len(snaps), 30):
        batch = build_batch(
            hostname=node, labels={}, devices=agent.backend.devices(), snapshots=snaps[i : i + 30]
        )
        ingest_service.ingest(ctx, IngestBatch.model_validate(batch), token_node=node)


def price(engine: Engine, clock: FakeClock, pattern: str, usd_per_hour: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(prices).values(
                model_pattern=pattern,
                usd_per_gpu_hour=usd_per_hour,
                effective_from=clock() - timedelta(days=1),
            )
        )


def ship_node(engine: Engine, clock: FakeClock, state: Path, *, host_proc: bool) -> None:
    """The NVML node's thirty minutes, from its agent through central's ingest."""
    proc = None
    if host_proc:  # hostPID: the agent reads each process's environment
        proc = state / "proc"
        for pid, name in [(4001, "trainer"), (4002, "notebook"), (5002, "slice-d")]:
            write_proc(proc, pid, name)
    with node_agent(state, node_gpus(), PODS, proc=proc, hostname=NODE) as (agent, _):
        ship(engine, clock, agent, NODE)
    price(engine, clock, "NVIDIA H100*", USD_PER_HOUR)


def roll_up(engine: Engine, rule: SplitRule) -> None:
    while True:
        with engine.begin() as conn:
            if rollup_repo.process_dirty(conn, thresholds=Thresholds(), split_rule=rule) == 0:
                return


def reports(
    engine: Engine, settings: Settings, clock: FakeClock
) -> tuple[dict[str, Any], dict[str, Any]]:
    start = clock() - timedelta(minutes=MINUTES + 5)
    end = start + timedelta(minutes=MINUTES)
    with engine.connect() as conn:
        by_job = cost_report(
            conn, settings=settings, start=start, end=end, now=clock(), group_by="job"
        )
        by_gpu = cost_report(
            conn, settings=settings, start=start, end=end, now=clock(), group_by="gpu"
        )
    return by_job, by_gpu


@pytest.mark.parametrize("host_proc", [False, True], ids=["no-hostPID", "hostPID"])
@pytest.mark.parametrize("rule", list(SplitRule))
def test_pods_sharing_gpus_each_pay_their_share_and_add_up_to_the_cent(
    engine: Engine,
    clock: FakeClock,
    settings: Settings,
    tmp_path: Path,
    rule: SplitRule,
    host_proc: bool,
) -> None:
    ship_node(engine, clock, tmp_path, host_proc=host_proc)
    with engine.begin() as conn:
        # Each pod's holder rows are kept, so no pod's interval is closed as unseen.
        assert observed_jobs_repo.close_unseen(conn, now=clock(), grace_seconds=600) == 0
        open_jobs = set(conn.execute(select(job_gpus.c.job_id)).scalars())
        holders_at_once = conn.execute(
            select(func.count())
            .where(gpu_processes.c.pid <= 0)
            .group_by(gpu_processes.c.ts, gpu_processes.c.gpu_id)
            .order_by(func.count().desc())
            .limit(1)
        ).scalar()
    assert open_jobs == POD_JOBS
    assert holders_at_once == (1 if host_proc else 3)  # the pods no process was seen of
    roll_up(engine, rule)
    settings.cost_split_rule = rule.value
    by_job, by_gpu = reports(engine, settings, clock)
    with engine.connect() as conn:
        tenants = set(conn.execute(select(tenant_1m.c.tenant).distinct()).scalars())
    assert tenants == POD_JOBS - {"k8s:ml/slice-c"}  # slice-c alone on its instance: unshared

    rows = {r["key"]: r for r in by_job["rows"]}
    assert set(rows) == POD_JOBS  # every pod its own row, no unattributed remainder
    gpu_cost = {r["key"]: r["cost_usd"] for r in by_gpu["rows"]}
    # Half an hour: the whole H100 $3.50, each 3g.40gb instance 3/7 of it, $1.50.
    assert sorted(gpu_cost.values()) == pytest.approx([1.5, 1.5, 3.5], abs=0.01)
    pods_usd = sum(r["cost_usd"] for r in rows.values())
    assert round(pods_usd, 2) == round(sum(gpu_cost.values()), 2)
    assert by_job["totals"]["cost_usd"] == pytest.approx(sum(gpu_cost.values()), abs=0.005)

    usd = {k.removeprefix("k8s:ml/"): r["cost_usd"] for k, r in rows.items()}
    assert usd["slice-c"] == pytest.approx(1.5, abs=0.01)  # its instance, priced as a slice
    assert usd["slice-d"] + usd["slice-e"] == pytest.approx(1.5, abs=0.01)
    assert usd["trainer"] + usd["notebook"] + usd["idle"] == pytest.approx(3.5, abs=0.01)
    idle_empty = {
        k.removeprefix("k8s:ml/"): r["causes"]["idle_empty"]["seconds"] for k, r in rows.items()
    }
    if not host_proc:
        # No process can be told apart: every rule falls back to the equal split, and no pod is
        # called empty, since any of them may run the processes the GPU shows.
        assert usd["trainer"] == pytest.approx(3.5 / 3, abs=0.01)
        assert usd["idle"] == pytest.approx(3.5 / 3, abs=0.01)
        assert usd["slice-d"] == pytest.approx(0.75, abs=0.01)
        assert all(v == 0 for v in idle_empty.values())
        return
    # hostPID: the idle pods are seen to run nothing while their GPU is busy.
    assert idle_empty["idle"] == pytest.approx(rows["k8s:ml/idle"]["allocated_seconds"])
    assert idle_empty["slice-e"] == pytest.approx(rows["k8s:ml/slice-e"]["allocated_seconds"])
    assert idle_empty["trainer"] == idle_empty["slice-d"] == 0
    if rule is SplitRule.EQUAL:
        assert usd["idle"] == pytest.approx(3.5 / 3, abs=0.01)
        assert usd["slice-e"] == pytest.approx(0.75, abs=0.01)
    else:  # by memory held (no per-process SM figures here): 6 GiB, 2 GiB, nothing
        assert usd["trainer"] == pytest.approx(3.5 * 6 / 8, abs=0.01)
        assert usd["notebook"] == pytest.approx(3.5 * 2 / 8, abs=0.01)
        assert usd["idle"] == pytest.approx(0.0, abs=0.01)
        assert usd["slice-d"] == pytest.approx(1.5, abs=0.01)


DATA = Path(__file__).resolve().parents[1] / "data" / "dcgm-exporter"
L40S = "GPU-585834da-79ca-0599-5140-4ffdb131ae93"


def time_sliced_l40s(value: float) -> str:
    """What dcgm-exporter with ``--kubernetes-virtual-gpus`` writes for two pods time-slicing
    one GPU: one series per pod, each with its replica (``vgpu``) and the GPU's own value. The
    label set is that of the real capture l40s-k8s.prom; no capture of this mode was found, so
    the repeated series follow dcgm-exporter's transformation/kubernetes.go (d5e5f51)."""
    lines = ["# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge"]
    for vgpu, name in enumerate(("tensorflow-0", "notebook-0")):
        lines.append(
            f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="{L40S}",pci_bus_id="00000000:4E:00.0",'
            f'device="nvidia0",modelName="NVIDIA L40S",Hostname="l40s.example.com",'
            f'container="main",namespace="redacted",pod="{name}",vgpu="{vgpu}"}} {value:.6f}'
        )
    return "\n".join(lines) + "\n"


def exporter_agent(state: Path, text: str, node: str) -> Agent:
    """An agent on the dcgm-exporter backend, scraping an exporter that answers ``text``."""
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, text=text)))
    return Agent(
        config=AgentConfig(hostname=node, labels={}, dead_letter_path=state / "dl"),
        backend=DcgmExporterBackend(url="http://dcgm.test/metrics", client=client),
        shipper=Shipper(central_url="http://127.0.0.1:9", token="t"),
        spool=Spool(state / "spool.sqlite"),
    )


@pytest.mark.parametrize("rule", list(SplitRule))
def test_dcgm_exporter_pods_of_a_time_sliced_gpu_and_of_mig_instances(
    engine: Engine, clock: FakeClock, settings: Settings, tmp_path: Path, rule: SplitRule
) -> None:
    """The time-sliced pods' repeated values say nothing of who ran what: they split the GPU
    equally whatever the rule, and neither is called idle while it is busy. The MIG capture's
    pods each pay their 1g.10gb instance, 1/7 of the H100."""
    for node, text in [
        ("l40s", time_sliced_l40s(0.41)),
        ("gsrh100-074", (DATA / "h100-mig-kserve.prom").read_text()),
    ]:
        (tmp_path / node).mkdir()
        agent = exporter_agent(tmp_path / node, text, node)
        try:
            ship(engine, clock, agent, node)
        finally:
            agent.close()
    price(engine, clock, "NVIDIA L40S", 2.0)
    price(engine, clock, "NVIDIA H100*", USD_PER_HOUR)
    with engine.begin() as conn:
        assert observed_jobs_repo.close_unseen(conn, now=clock(), grace_seconds=600) == 0
    roll_up(engine, rule)
    settings.cost_split_rule = rule.value
    by_job, by_gpu = reports(engine, settings, clock)
    rows = {r["key"]: r for r in by_job["rows"]}
    tf, nb = rows["k8s:redacted/tensorflow-0"], rows["k8s:redacted/notebook-0"]
    assert tf["cost_usd"] == pytest.approx(0.5, abs=0.01)  # $2/h, half an hour, halved
    assert nb["cost_usd"] == pytest.approx(0.5, abs=0.01)
    for r in (tf, nb):
        assert r["causes"]["idle_empty"]["seconds"] == 0
        assert r["causes"]["idle_held"]["seconds"] == 0
    kserve = [r for k, r in rows.items() if k and k.startswith("k8s:model-playground-stg/")]
    assert [r["cost_usd"] for r in kserve] == pytest.approx([0.5, 0.5], abs=0.01)  # $7/h / 7
    total = sum(r["cost_usd"] for r in by_gpu["rows"])
    assert total == pytest.approx(1.0 + 3 * 0.5, abs=0.01)  # instance 8 is held by no pod
    assert round(sum(r["cost_usd"] for r in rows.values()), 2) == round(total, 2)


def test_a_pods_holder_row_is_no_process_so_an_unused_allocation_is_idle_empty(
    engine: Engine, clock: FakeClock
) -> None:
    """A pod holds a GPU and runs nothing: the agent's ``pid: 0`` row names the pod, and the
    GPU's sample stays ``idle_empty`` (the waste the allocated-idle-gpu policy looks for), not
    ``idle_held`` as if a process sat on it."""
    ctx = ServiceContext(
        settings=Settings(database_url="sqlite://", run_scheduler=False), engine=engine, clock=clock
    )
    ts = iso(clock() - timedelta(minutes=1))
    batch = {
        "node": {"hostname": NODE, "labels": {}},
        "gpus": [{"uuid": WHOLE, "index": 0, "model": "NVIDIA H100 80GB HBM3"}],
        "samples": [
            {"gpu_uuid": WHOLE, "ts": ts, "metrics": {"sm_active": 0.0, "fb_used_bytes": 2**29}}
        ],
        "processes": [
            {"gpu_uuid": WHOLE, "ts": ts, "pid": 0, "job_id": "k8s:ml/a"},
            {"gpu_uuid": WHOLE, "ts": ts, "pid": 0, "job_id": "k8s:ml/b"},
        ],
    }
    got = ingest_service.ingest(ctx, IngestBatch.model_validate(batch), token_node=NODE)
    assert got.processes_received == 2  # both pods' rows kept
    with engine.connect() as conn:
        assert conn.execute(select(samples.c.cause)).scalar() == int(Cause.IDLE_EMPTY)
        held = conn.execute(
            select(gpu_processes.c.pid, gpu_processes.c.job_id).order_by(gpu_processes.c.pid)
        ).all()
    assert [tuple(r) for r in held] == [(-1, "k8s:ml/b"), (0, "k8s:ml/a")]
