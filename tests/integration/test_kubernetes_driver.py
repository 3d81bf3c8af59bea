"""The Kubernetes reclaim driver through the official client against a fake API server on
loopback (no API server can run here): what it does to the cluster's objects, what it answers,
and every request it sends checked against Kubernetes' OpenAPI document and the RBAC shipped in
deploy/kubernetes/components/reclaim; and the ladder's re-read of a pod through it before a step
(a pod the API no longer has is left alone, an API that cannot answer changes nothing)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from sqlalchemy import Engine

from service.actions.base import ReclaimTarget, SchedulerFacts
from service.actions.kubernetes import MODES, KubernetesDriver, pod_of
from service.db import actions_repo
from service.settings import Settings
from tests.alerting_support import add_job
from tests.k8s_support import K8S, check_request, rbac_grants, rbac_need, validate_schema
from tests.kube_api_fake import TOKEN, FakeKubeApi
from tests.ladder_support import IDLE_HELD, STEPS, LadderWorld
from tests.receivers import Receiver
from tests.support import FakeClock

NS = "ml"


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    fake = FakeKubeApi()
    yield fake
    fake.close()


@pytest.fixture
def driver(api: FakeKubeApi, tmp_path: Path) -> KubernetesDriver:
    return KubernetesDriver(kubeconfig=api.kubeconfig(tmp_path), timeout_seconds=5.0)


def target(pod: str, mode: str, **kw: Any) -> ReclaimTarget:
    return ReclaimTarget(job_id=f"k8s:{NS}/{pod}", mode=mode, nodes=("node-a",), **kw)


def sent(api: FakeKubeApi) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in api.requests]


POD_PATH = f"/api/v1/namespaces/{NS}/pods"


def test_delete_pod_deletes_the_pod_that_was_read(api: FakeKubeApi, driver: KubernetesDriver):
    uid = api.add_pod(NS, "train-0")
    result = driver.reclaim(target("train-0", "delete_pod"), dry_run=False)
    assert result.outcome == "reclaimed", result
    assert sent(api) == [("GET", f"{POD_PATH}/train-0"), ("DELETE", f"{POD_PATH}/train-0")]
    assert api.requests[1].body == {"preconditions": {"uid": uid}}  # never a newer namesake
    assert "deletionTimestamp" in api.pods[(NS, "train-0")]["metadata"]
    assert uid in result.detail and "DELETE" in result.detail


def test_scale_to_zero_scales_the_deployment_behind_the_replicaset(
    api: FakeKubeApi, driver: KubernetesDriver
):
    rs = api.add_deployment(NS, "notebook", replicas=3)
    api.add_pod(NS, f"{rs}-x7k2p", owner=("ReplicaSet", rs))
    result = driver.reclaim(target(f"{rs}-x7k2p", "scale_to_zero"), dry_run=False)
    assert result.outcome == "reclaimed", result
    scale = f"/apis/apps/v1/namespaces/{NS}/deployments/notebook/scale"
    assert sent(api) == [
        ("GET", f"{POD_PATH}/{rs}-x7k2p"),
        ("GET", f"/apis/apps/v1/namespaces/{NS}/replicasets/{rs}"),
        ("GET", scale),
        ("PATCH", scale),
    ]
    assert api.requests[-1].body == {"spec": {"replicas": 0}}
    assert api.requests[-1].content_type == "application/merge-patch+json"
    assert api.scales[(NS, "deployments", "notebook")] == 0
    assert "was 3 replicas" in result.detail


def test_scale_to_zero_scales_a_statefulset(api: FakeKubeApi, driver: KubernetesDriver):
    api.add_statefulset(NS, "llm", replicas=1)
    api.add_pod(NS, "llm-0", owner=("StatefulSet", "llm"))
    result = driver.reclaim(target("llm-0", "scale_to_zero"), dry_run=False)
    assert result.outcome == "reclaimed", result
    assert api.scales[(NS, "statefulsets", "llm")] == 0
    assert sent(api)[-1] == ("PATCH", f"/apis/apps/v1/namespaces/{NS}/statefulsets/llm/scale")


def test_dry_run_reads_and_changes_nothing(api: FakeKubeApi, driver: KubernetesDriver):
    uid = api.add_pod(NS, "train-0")
    rs = api.add_deployment(NS, "notebook", replicas=2)
    api.add_pod(NS, "nb-1", owner=("ReplicaSet", rs))
    deleted = driver.reclaim(target("train-0", "delete_pod"), dry_run=True)
    scaled = driver.reclaim(target("nb-1", "scale_to_zero"), dry_run=True)
    assert deleted.outcome == scaled.outcome == "would"
    assert deleted.detail == f"DELETE {POD_PATH}/train-0 (uid {uid})"
    assert scaled.detail == (
        f"PATCH /apis/apps/v1/namespaces/{NS}/deployments/notebook/scale "
        '{"spec":{"replicas":0}} (now 2 replicas)'
    )
    assert {r.method for r in api.requests} == {"GET"}
    assert "deletionTimestamp" not in api.pods[(NS, "train-0")]["metadata"]
    assert api.scales[(NS, "deployments", "notebook")] == 2


def test_a_retried_step_sends_nothing_more_once_done(api: FakeKubeApi, driver: KubernetesDriver):
    api.add_pod(NS, "train-0")
    api.add_statefulset(NS, "llm", replicas=1)
    api.add_pod(NS, "llm-0", owner=("StatefulSet", "llm"))
    for _ in range(2):
        first = driver.reclaim(target("train-0", "delete_pod"), dry_run=False)
        again = driver.reclaim(target("llm-0", "scale_to_zero"), dry_run=False)
        assert first.outcome == again.outcome == "reclaimed"
    assert [m for m, _ in sent(api)].count("DELETE") == 1
    assert [m for m, _ in sent(api)].count("PATCH") == 1
    assert "already being deleted" in first.detail
    assert "already scaled to 0" in again.detail


def test_a_pod_that_is_gone_or_ended_is_gone(api: FakeKubeApi, driver: KubernetesDriver):
    api.add_pod(NS, "done", phase="Succeeded")
    for pod in ("missing", "done"):
        for mode in ("delete_pod", "scale_to_zero"):
            result = driver.reclaim(target(pod, mode), dry_run=False)
            assert result.outcome == "gone", (pod, mode, result)
    assert {r.method for r in api.requests} == {"GET"}
    done = driver.reclaim(target("done", "delete_pod"), dry_run=False)
    assert done.detail == "pod ml/done has ended (Succeeded)"


# --- only the job's own pod, named as Kubernetes names it -----------------------------------

# Each names no pod a cluster can have; unencoded, the first two would be a DELETE of
# /api/v1/namespaces/kube-system/ and of every pod in ml.
REFUSED_IDS = {
    "k8s:kube-system/..": "pod name '..' is not a DNS-1123 subdomain",
    "k8s:ml/.": "pod name '.' is not a DNS-1123 subdomain",
    "k8s:ml/a%2Fb": "pod name 'a%2Fb' is not a DNS-1123 subdomain",
    "k8s:ml/a/b": "pod name 'a/b' is not a DNS-1123 subdomain",
    "k8s:ml/Train-0": "pod name 'Train-0' is not a DNS-1123 subdomain",
    "k8s:ML/train-0": "namespace 'ML' is not a DNS-1123 label",
    "k8s:ml/": "pod name '' is not a DNS-1123 subdomain",
    "k8s:/train-0": "namespace '' is not a DNS-1123 label",
    "k8s:ml.x/train-0": "namespace 'ml.x' is not a DNS-1123 label",
    "kubernetes:ml/..": "pod name '..' is not a DNS-1123 subdomain",
    # A regex's "$" would let a trailing newline through: another spelling of ml/train-0.
    "k8s:ml/train-0\n": "pod name 'train-0\\n' is not a DNS-1123 subdomain",
    "k8s:ml\n/train-0": "namespace 'ml\\n' is not a DNS-1123 label",
}
UID = "k8s:1b7f0c2e-0000-4000-8000-000000000000"
REFUSED_LABELS = {
    (UID, "kube-system", ".."): "label pod: '..' is not a DNS-1123 subdomain",
    (UID, "..", "train-0"): "label namespace: '..' is not a DNS-1123 label",
    (UID, "ml", ""): "label pod: '' is not a DNS-1123 subdomain",
    # The labels name another pod than the id: which one the job is, nobody can say.
    (f"k8s:{NS}/train-0", "kube-system", "train-0"): "label namespace 'kube-system' is not",
    (f"k8s:{NS}/train-0", NS, "coredns"): "label pod 'coredns' is not the job id's 'train-0'",
}


def refused_targets() -> list[tuple[ReclaimTarget, str]]:
    by_id = [(ReclaimTarget(j, "delete_pod", nodes=("node-a",)), w) for j, w in REFUSED_IDS.items()]
    by_labels = [
        (ReclaimTarget(j, "delete_pod", nodes=("node-a",), labels={"namespace": n, "pod": p}), w)
        for (j, n, p), w in REFUSED_LABELS.items()
    ]
    return by_id + by_labels


def test_names_no_pod_can_have_are_refused_before_any_request(
    api: FakeKubeApi, driver: KubernetesDriver, caplog: pytest.LogCaptureFixture
):
    api.add_pod(NS, "train-0")
    api.add_pod("kube-system", "coredns")
    for bad, words in refused_targets():
        for mode in MODES:
            for dry_run in (False, True):
                result = driver.reclaim(replace(bad, mode=mode), dry_run=dry_run)
                assert result.outcome == "failed", (bad, result)
                assert result.detail.startswith("refused: ") and words in result.detail, result
        probed = driver.probe(bad)
        assert probed.outcome == "mismatch" and words in probed.detail, (bad, probed)
        assert probed.facts is None
    assert api.requests == []  # not one request, not even a read
    refusals = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(refusals) == len(refused_targets()) * 5  # each attempt logs why
    assert "refuses to reclaim job k8s:kube-system/..: job id" in refusals[0]


def test_sound_names_still_act_and_labels_may_repeat_the_id(
    api: FakeKubeApi, driver: KubernetesDriver
):
    longest = "x" * 253  # one part longer than a label's 63: Kubernetes allows it
    for pod in ("train-0.shard-1", longest):
        api.add_pod(NS, pod)
        assert driver.reclaim(target(pod, "delete_pod"), dry_run=True).outcome == "would"
    same = {"namespace": NS, "pod": "train-0.shard-1"}
    repeated = target("train-0.shard-1", "delete_pod", labels=same)
    assert driver.reclaim(repeated, dry_run=True).outcome == "would"
    assert driver.probe(ReclaimTarget(UID, "delete_pod", labels=same)).outcome == "present"
    too_long = driver.reclaim(target(longest + "x", "delete_pod"), dry_run=True)
    assert too_long.outcome == "failed" and "is not a DNS-1123 subdomain" in too_long.detail


def test_names_read_from_the_api_are_checked_before_they_reach_a_path(
    api: FakeKubeApi, driver: KubernetesDriver
):
    # An owner reference is the API's answer, not GPU Warden's record: checked the same way.
    api.add_pod(NS, "nb-1", owner=("ReplicaSet", ".."))
    api.replicasets[(NS, "rs")] = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "rs", "namespace": NS, "uid": "u"},
        "spec": {"selector": {}},
    }
    api.replicasets[(NS, "rs")]["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "a/b",
            "uid": "d",
            "controller": True,
        }
    ]
    api.add_pod(NS, "nb-2", owner=("ReplicaSet", "rs"))
    up = driver.reclaim(target("nb-1", "scale_to_zero"), dry_run=False)
    assert up.outcome == "failed" and "ReplicaSet ml/..: refused, '..' is not" in up.detail
    above = driver.reclaim(target("nb-2", "scale_to_zero"), dry_run=False)
    assert above.outcome == "failed" and "refused, 'a/b' is not" in above.detail
    assert sent(api) == [
        ("GET", f"{POD_PATH}/nb-1"),
        ("GET", f"{POD_PATH}/nb-2"),
        ("GET", f"/apis/apps/v1/namespaces/{NS}/replicasets/rs"),
    ]


# --- what the API says of the job, and a pod that is not the job's ---------------------------

STARTED = datetime(2026, 12, 2, 7, 0, tzinfo=UTC)  # the fake's pods' start


def test_probe_answers_what_the_api_says_of_the_pod(
    api: FakeKubeApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    api.add_namespace(NS, {"example.com/team": "vision", "team": "not-this-key"})
    # The pod's own labels are its owner's to write: a team there is never the account.
    api.add_pod(NS, "train-0", labels={"owner": "alice", "example.com/team": "free-for-all"})
    settings = Settings(
        kubernetes_kubeconfig=api.kubeconfig(tmp_path),
        kubernetes_team_label="example.com/team",
        kubernetes_user_label="owner",
    )
    driver = KubernetesDriver.from_settings(settings)
    found = driver.probe(target("train-0", "delete_pod", user="alice", started_at=STARTED))
    assert found.outcome == "present", found
    assert found.facts == SchedulerFacts(
        job_id=f"k8s:{NS}/train-0",
        user="alice",
        nodes=("node-a",),
        account="vision",
        started_at=STARTED,
    )
    assert sent(api) == [("GET", f"{POD_PATH}/train-0"), ("GET", f"/api/v1/namespaces/{NS}")]
    assert not caplog.records


def test_probe_without_the_labels_knows_no_owner_or_account(
    api: FakeKubeApi, driver: KubernetesDriver
):
    api.add_pod(NS, "train-0", labels={"owner": "bob", "team": "x"})  # no user label configured
    found = driver.probe(target("train-0", "delete_pod", user="alice"))
    assert found.outcome == "present" and found.facts is not None
    assert (found.facts.user, found.facts.account) == (None, None)
    api.add_namespace(NS, {"team": "vision"})  # the default team label
    found = driver.probe(target("train-0", "delete_pod"))
    assert found.facts is not None and found.facts.account == "vision"


def test_probe_without_the_namespace_read_says_unknown(api: FakeKubeApi, driver: KubernetesDriver):
    api.add_pod(NS, "train-0")
    # The role of an older release lacks "get namespaces": no team, so no verdict this round.
    api.fail.append(("GET", f"/api/v1/namespaces/{NS}", 403))
    found = driver.probe(target("train-0", "delete_pod"))
    assert found.outcome == "unknown" and "GET namespace ml: HTTP 403" in found.detail


MISMATCHES = {
    "moved": ("runs on node-b, not on node-a",),
    "bobs": ("belongs to 'bob' (label owner), not 'alice'",),
    "recreated": (
        "started 2026-12-02T09:00:00+00:00, after the job recorded at 2026-12-02T08:00:00+00:00"
        ": a newer pod of the same name",
    ),
    "all-three": ("runs on node-b", "belongs to 'bob'", "a newer pod of the same name"),
}


def test_a_pod_that_is_not_the_jobs_is_refused_naming_each_difference(
    api: FakeKubeApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    api.add_pod(NS, "moved", node="node-b", labels={"owner": "alice"})
    api.add_pod(NS, "bobs", labels={"owner": "bob"})
    api.add_pod(NS, "recreated", labels={"owner": "alice"}, started="2026-12-02T09:00:00Z")
    api.add_pod(
        NS, "all-three", node="node-b", labels={"owner": "bob"}, started="2026-12-03T00:00:00Z"
    )
    driver = KubernetesDriver(kubeconfig=api.kubeconfig(tmp_path), user_label="owner")
    recorded = datetime(2026, 12, 2, 8, 0)  # naive, as SQLite gives it back: read as UTC
    for pod, words in MISMATCHES.items():
        job = target(pod, "delete_pod", user="alice", started_at=recorded)
        found = driver.probe(job)
        assert found.outcome == "mismatch", (pod, found)
        assert found.detail.startswith(f"refused: pod {NS}/{pod} ")
        assert all(w in found.detail for w in words), found.detail
        assert found.facts is not None and found.facts.job_id == f"k8s:{NS}/{pod}"
        for dry_run in (True, False):
            result = driver.reclaim(job, dry_run=dry_run)
            assert result.outcome == "failed" and result.detail == found.detail, result
    assert {m for m, _ in sent(api)} == {"GET"}  # no delete; no namespace read either
    assert all(p.startswith(f"{POD_PATH}/") for _, p in sent(api))
    assert not any("deletionTimestamp" in p["metadata"] for p in api.pods.values())
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 3 * len(MISMATCHES)
    assert any("refuses to reclaim job k8s:ml/bobs: pod ml/bobs belongs to" in w for w in warned)


def test_a_pod_started_within_the_tolerance_or_before_is_the_jobs(
    api: FakeKubeApi, driver: KubernetesDriver
):
    api.add_pod(NS, "skewed", started="2026-12-02T08:04:59Z")  # the agent's clock was behind
    api.add_pod(NS, "early", started="2026-12-01T00:00:00Z")  # seen long after it started
    recorded = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    for pod in ("skewed", "early"):
        job = target(pod, "delete_pod", started_at=recorded)
        assert driver.probe(job).outcome == "present"
        assert driver.reclaim(job, dry_run=False).outcome == "reclaimed"
    api.add_pod(NS, "late", started="2026-12-02T08:05:01Z")
    late = driver.probe(target("late", "delete_pod", started_at=recorded))
    assert late.outcome == "mismatch"


def test_the_api_servers_refusals_are_failures_with_the_reason(
    api: FakeKubeApi, driver: KubernetesDriver
):
    api.add_pod(NS, "train-0")
    for code, words in ((409, "HTTP 409 Conflict: scripted 409"), (500, "HTTP 500"), (403, "403")):
        api.fail.append(("DELETE", f"{POD_PATH}/train-0", code))
        result = driver.reclaim(target("train-0", "delete_pod"), dry_run=False)
        assert result.outcome == "failed", result
        assert words in result.detail
    # Deleted between the read and the delete: done, by someone else.
    api.fail.append(("DELETE", f"{POD_PATH}/train-0", 404))
    assert driver.reclaim(target("train-0", "delete_pod"), dry_run=False).outcome == "gone"
    assert "deletionTimestamp" not in api.pods[(NS, "train-0")]["metadata"]


def test_a_newer_pod_of_the_same_name_is_not_deleted(api: FakeKubeApi, driver: KubernetesDriver):
    api.add_pod(NS, "llm-0")
    real = copy.deepcopy(api.pods[(NS, "llm-0")])
    # Between the read and the delete the pod is re-created under the same name.
    original_answer = api.answer

    def recreate_after_read(method: str, path: str, headers: Any, raw: bytes) -> Any:
        out = original_answer(method, path, headers, raw)
        if method == "GET":
            api.pods[(NS, "llm-0")] = real | {"metadata": real["metadata"] | {"uid": "new"}}
        return out

    api.answer = recreate_after_read  # type: ignore[method-assign]
    result = driver.reclaim(target("llm-0", "delete_pod"), dry_run=False)
    assert result.outcome == "failed"
    assert "409" in result.detail and "Precondition failed" in result.detail
    assert "deletionTimestamp" not in api.pods[(NS, "llm-0")]["metadata"]


def test_a_slow_api_server_is_a_failure_after_the_timeout(api: FakeKubeApi, tmp_path: Path):
    api.add_pod(NS, "train-0")
    api.delay_seconds = 1.0
    slow = KubernetesDriver(kubeconfig=api.kubeconfig(tmp_path), timeout_seconds=0.2)
    result = slow.reclaim(target("train-0", "delete_pod"), dry_run=False)
    assert result.outcome == "failed"
    assert "timed out after 0.2 s" in result.detail
    assert len(api.requests) == 1  # one attempt: the ladder's next round is the retry


def test_pods_without_a_scalable_owner_fail_and_say_why(api: FakeKubeApi, driver: KubernetesDriver):
    api.add_pod(NS, "bare")
    api.add_pod(NS, "batch-x", owner=("Job", "batch"))
    api.replicasets[(NS, "lonely")] = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "lonely", "namespace": NS, "uid": "u"},
        "spec": {"selector": {}},
    }
    api.add_pod(NS, "lonely-1", owner=("ReplicaSet", "lonely"))
    api.add_pod(NS, "orphan-1", owner=("ReplicaSet", "deleted-rs"))
    expected = {
        "bare": "has no controller",
        "batch-x": "has controller Job batch",
        "lonely-1": "ReplicaSet lonely has no Deployment",
        "orphan-1": "ReplicaSet ml/deleted-rs: not found",
    }
    for pod, words in expected.items():
        result = driver.reclaim(target(pod, "scale_to_zero"), dry_run=False)
        assert result.outcome == "failed", (pod, result)
        assert words in result.detail, result.detail
    assert {r.method for r in api.requests} == {"GET"}


def test_probe_says_whether_the_pod_still_holds_the_gpus(
    api: FakeKubeApi, driver: KubernetesDriver, tmp_path: Path
):
    api.add_pod(NS, "train-0")
    api.add_pod(NS, "moved", node="node-b")
    assert driver.probe(target("train-0", "delete_pod")).outcome == "present"
    assert driver.probe(target("moved", "delete_pod")).outcome == "mismatch"  # see below
    assert driver.probe(target("missing", "delete_pod")).outcome == "gone"
    api.add_pod(NS, "stopping")
    api.pods[(NS, "stopping")]["metadata"]["deletionTimestamp"] = "2026-12-04T12:00:00Z"
    assert driver.probe(target("stopping", "delete_pod")).outcome == "gone"
    api.fail.append(("GET", f"{POD_PATH}/train-0", 503))
    unknown = driver.probe(target("train-0", "delete_pod"))
    assert unknown.outcome == "unknown" and "503" in unknown.detail
    assert {r.method for r in api.requests} == {"GET"}


def test_without_an_api_every_reclaim_fails_with_the_reason(tmp_path: Path):
    missing = KubernetesDriver(kubeconfig=tmp_path / "no-such-kubeconfig")
    result = missing.reclaim(target("train-0", "delete_pod"), dry_run=False)
    assert result.outcome == "failed" and "no Kubernetes API" in result.detail
    in_cluster = KubernetesDriver()  # not in a pod: no service account token here
    result = in_cluster.reclaim(target("train-0", "delete_pod"), dry_run=False)
    assert result.outcome == "failed" and "GPUWARDEN_KUBERNETES_KUBECONFIG" in result.detail
    assert in_cluster.probe(target("train-0", "delete_pod")).outcome == "unknown"


def test_jobs_that_name_no_pod_and_unknown_modes_fail(driver: KubernetesDriver):
    by_uid = ReclaimTarget(job_id="k8s:1b7f0c2e-0000-4000-8000-000000000000", mode="delete_pod")
    assert driver.reclaim(by_uid, dry_run=False).outcome == "failed"
    labelled = ReclaimTarget("k8s:x", "delete_pod", labels={"namespace": "ml", "pod": "p"})
    assert str(pod_of(labelled)) == "ml/p"
    assert str(pod_of(target("train-0", "delete_pod"))) == "ml/train-0"
    assert pod_of(ReclaimTarget("slurm:42", "delete_pod")) is None
    assert driver.reclaim(target("p", "evict"), dry_run=False).outcome == "failed"


# --- the recorded contract -----------------------------------------------------------------


def every_request(api: FakeKubeApi, driver: KubernetesDriver) -> list[Any]:
    """The driver's every kind of request, each path it takes run once (the contract)."""
    api.add_pod(NS, "train-0")
    rs = api.add_deployment(NS, "notebook", replicas=2)
    api.add_pod(NS, "nb-1", owner=("ReplicaSet", rs))
    api.add_statefulset(NS, "llm", replicas=1)
    api.add_pod(NS, "llm-0", owner=("StatefulSet", "llm"))
    driver.probe(target("train-0", "delete_pod"))
    for pod, mode in (
        ("train-0", "delete_pod"),
        ("nb-1", "scale_to_zero"),
        ("llm-0", "scale_to_zero"),
    ):
        assert driver.reclaim(target(pod, mode), dry_run=True).outcome == "would"
        assert driver.reclaim(target(pod, mode), dry_run=False).outcome == "reclaimed"
    return api.requests


def test_every_request_is_an_operation_of_the_kubernetes_openapi(
    api: FakeKubeApi, driver: KubernetesDriver
):
    seen = set()
    for r in every_request(api, driver):
        seen.add((r.method, check_request(r.method, r.path, r.query, r.content_type, r.body)))
    assert seen == {
        ("GET", "/api/v1/namespaces/{name}"),
        ("GET", "/api/v1/namespaces/{namespace}/pods/{name}"),
        ("DELETE", "/api/v1/namespaces/{namespace}/pods/{name}"),
        ("GET", "/apis/apps/v1/namespaces/{namespace}/replicasets/{name}"),
        ("GET", "/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"),
        ("PATCH", "/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"),
        ("GET", "/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}/scale"),
        ("PATCH", "/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}/scale"),
    }


def test_the_fake_answers_a_scale_and_a_namespace_as_the_schema_says(api: FakeKubeApi):
    api.add_statefulset(NS, "llm", replicas=1)
    api.add_namespace(NS, {"team": "vision"})
    auth = {"authorization": f"Bearer {TOKEN}"}
    code, scale = api.answer(
        "GET", f"/apis/apps/v1/namespaces/{NS}/statefulsets/llm/scale", auth, b""
    )
    assert code == 200
    validate_schema(scale, "#/definitions/io.k8s.api.autoscaling.v1.Scale")
    code, namespace = api.answer("GET", f"/api/v1/namespaces/{NS}", auth, b"")
    assert code == 200 and namespace["metadata"]["labels"] == {"team": "vision"}
    validate_schema(namespace, "#/definitions/io.k8s.api.core.v1.Namespace")
    with pytest.raises(jsonschema.ValidationError):  # labels are strings
        validate_schema(
            namespace | {"metadata": {"labels": {"team": 1}}},
            "#/definitions/io.k8s.api.core.v1.Namespace",
        )


def test_the_contract_check_has_teeth():
    pod = f"{POD_PATH}/p"
    scale = f"/apis/apps/v1/namespaces/{NS}/deployments/d/scale"
    with pytest.raises(AssertionError, match="no such path"):
        check_request("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/d", {}, None, None)
    with pytest.raises(AssertionError, match="has no POST"):
        check_request("POST", pod, {}, None, None)
    with pytest.raises(AssertionError, match="undeclared"):
        check_request("DELETE", pod, {"graceSeconds": ["0"]}, None, None)
    with pytest.raises(jsonschema.ValidationError):  # a misspelt DeleteOptions field
        check_request("DELETE", pod, {}, "application/json", {"precondition": {"uid": "u"}})
    with pytest.raises(jsonschema.ValidationError):  # replicas is an integer
        check_request(
            "PATCH", scale, {}, "application/merge-patch+json", {"spec": {"replicas": "0"}}
        )
    with pytest.raises(jsonschema.ValidationError):  # not a field of a Scale
        check_request(
            "PATCH", scale, {}, "application/merge-patch+json", {"spec": {"paused": True}}
        )
    with pytest.raises(AssertionError, match="not in"):
        check_request("PATCH", scale, {}, "text/plain", {"spec": {"replicas": 0}})


def reclaim_rules() -> list[dict[str, Any]]:
    docs = yaml.safe_load_all((K8S / "components" / "reclaim" / "rbac.yaml").read_text())
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def test_the_shipped_rbac_allows_exactly_the_requests_the_driver_sends(
    api: FakeKubeApi, driver: KubernetesDriver
):
    needed = {rbac_need(r.method, r.path) for r in every_request(api, driver)}
    granted = rbac_grants(reclaim_rules())
    assert needed - granted == set(), "a request the ClusterRole does not allow"
    assert granted - needed == set(), "a rule no request uses: not least privilege"


def test_the_rbac_check_has_teeth():
    assert rbac_need("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/d/scale") == (
        "apps",
        "deployments/scale",
        "patch",
    )
    assert rbac_need("DELETE", f"{POD_PATH}/p") == ("", "pods", "delete")
    assert rbac_need("GET", f"/api/v1/namespaces/{NS}") == ("", "namespaces", "get")
    with pytest.raises(AssertionError, match="wildcard"):
        rbac_grants([{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}])


def pod_ladder(
    app: Any, engine: Engine, clock: FakeClock, receiver: Receiver, driver: KubernetesDriver
) -> LadderWorld:
    """The idle-held ladder (acting) on the pod ``k8s:ml/train-0``, reclaimed by ``driver``."""
    world = LadderWorld(app.state.ctx, engine, clock, receiver, {"kubernetes": driver})
    world.samples(1, IDLE_HELD)
    world.setup({"steps": STEPS, "dry_run": False})
    add_job(engine, POD_JOB, world.gpus, started_at=clock() - timedelta(minutes=1))
    return world


POD_JOB = f"k8s:{NS}/train-0"


def test_the_ladder_leaves_a_pod_the_api_no_longer_has(
    app: Any,
    engine: Engine,
    clock: FakeClock,
    receiver: Receiver,
    api: FakeKubeApi,
    driver: KubernetesDriver,
) -> None:
    api.add_pod(NS, "train-0")
    world = pod_ladder(app, engine, clock, receiver, driver)
    world.idle_for(6)
    assert world.actions(POD_JOB) == [("notify_owner", "warned")]
    del api.pods[(NS, "train-0")]  # deleted, though its GPU's last minutes still read idle-held
    world.idle_for(10)
    assert world.actions(POD_JOB) == [("notify_owner", "warned"), ("notify_owner", "gone")]
    with engine.connect() as conn:
        last = actions_repo.list_actions(conn, job_id=POD_JOB)[0]
    assert last["driver"] == "kubernetes"
    assert str(last["reason"]).startswith(
        "the kubernetes driver asked the scheduler: GET pod ml/train-0"
    )
    assert {m for m, _ in sent(api)} == {"GET"} and len(world.notices()) == 1


def test_the_ladder_holds_every_step_while_the_api_cannot_say(
    app: Any, engine: Engine, clock: FakeClock, receiver: Receiver, tmp_path: Path
) -> None:
    # Never act on what cannot be verified: no warning either, until the API answers.
    unreachable = KubernetesDriver(kubeconfig=tmp_path / "no-such-kubeconfig")
    world = pod_ladder(app, engine, clock, receiver, unreachable)
    world.idle_for(14)
    assert world.actions(POD_JOB) == [("notify_owner", "held")]
    assert world.notices() == []


@pytest.mark.parametrize("owner", ["alice", "bob"])
def test_the_ladder_reclaims_the_jobs_pod_and_never_another_owners(
    app: Any,
    engine: Engine,
    clock: FakeClock,
    receiver: Receiver,
    api: FakeKubeApi,
    tmp_path: Path,
    owner: str,
) -> None:
    api.add_namespace(NS, {"team": "ml"})
    api.add_pod(NS, "train-0", labels={"owner": owner})  # GPU Warden's record says alice
    driver = KubernetesDriver(kubeconfig=api.kubeconfig(tmp_path), user_label="owner")
    world = pod_ladder(app, engine, clock, receiver, driver)
    world.idle_for(20)
    deleted = "deletionTimestamp" in api.pods[(NS, "train-0")]["metadata"]
    if owner == "alice":  # the job's own pod, idle and warned: reclaimed on time
        assert world.actions(POD_JOB)[-1] == ("reclaim", "reclaimed")
        assert deleted and ("DELETE", f"{POD_PATH}/train-0") in sent(api)
    else:  # bob's pod under the job's name: whatever the ladder records, nothing is deleted
        assert ("reclaim", "reclaimed") not in world.actions(POD_JOB)
        assert not deleted and {m for m, _ in sent(api)} == {"GET"}
