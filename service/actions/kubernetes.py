"""Kubernetes reclaim driver: delete a job's pod, or scale the Deployment or StatefulSet that owns
it to zero, through the official ``kubernetes`` client.

A Kubernetes job is a pod, ``k8s:<namespace>/<pod>`` (the kubelet's pod resources and
dcgm-exporter's pod labels name it so); the job's ``namespace`` and ``pod`` labels say the same
where the id does not. A namespace that is not a DNS-1123 label, a name that is not a DNS-1123
subdomain (``.``, ``..``, ``a%2Fb``, upper case, empty) or an id and labels naming different pods
are refused before any request: such a name is no pod's, and in a path it would name another
object (``pods/..`` is the namespace itself). Every path segment is checked again where the client
is called (names read from the API included) and percent-encoded by the client.

The requests, each under the configured timeout and never retried here (the ladder tries again on
a later round):

- read: ``GET /api/v1/namespaces/{ns}/pods/{pod}``; the pod must still run on the job's node,
  have the job's owner (the pod label GPUWARDEN_KUBERNETES_USER_LABEL names, where set) and have
  started no later than the job GPU Warden recorded (a re-created pod of the same name is another
  job): any difference is a refusal, logged and named;
- the probe only: ``GET /api/v1/namespaces/{ns}``, whose team label
  (GPUWARDEN_KUBERNETES_TEAM_LABEL) is the account the scheduler's facts carry;
- ``delete_pod``: ``DELETE`` of that pod with ``preconditions.uid`` (the pod that was read,
  never a new pod of the same name);
- ``scale_to_zero``: the pod's controller, a StatefulSet, or a ReplicaSet
  (``GET /apis/apps/v1/namespaces/{ns}/replicasets/{rs}``) whose controller is a Deployment;
  then ``GET`` and a merge ``PATCH`` of ``{"spec": {"replicas": 0}}`` on its ``scale``
  subresource.

The ServiceAccount and the ClusterRole that allow exactly these are in
deploy/kubernetes/components/reclaim.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from service.actions.base import (
    ProbeOutcome,
    ProbeResult,
    ReclaimOutcome,
    ReclaimResult,
    ReclaimTarget,
    SchedulerFacts,
)
from service.core.job_ids import (
    KUBERNETES_PREFIXES,
    dns1123_label_problem,
    dns1123_subdomain_problem,
)

if TYPE_CHECKING:
    from kubernetes.client import AppsV1Api, CoreV1Api, V1Pod

    from service.settings import Settings

log = logging.getLogger(__name__)

MODES = ("delete_pod", "scale_to_zero")
# The owners scale_to_zero can scale, as the pod's controller reference names them.
SCALABLE = {"Deployment": "deployments", "StatefulSet": "statefulsets"}
MERGE_PATCH = "application/merge-patch+json"
ZERO_REPLICAS: dict[str, Any] = {"spec": {"replicas": 0}}
# How much later than GPU Warden's record of the job its pod may have started (clock skew between
# the agent and the API server); a pod started later than that is a newer pod of the same name.
START_TOLERANCE_SECONDS = 300.0


@dataclass(frozen=True)
class PodRef:
    """A pod by namespace and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def problem(self) -> str | None:
        """Why no pod can have this name (namespace or name not in DNS-1123 form), or None."""
        return _prefixed("namespace ", dns1123_label_problem(self.namespace)) or _prefixed(
            "pod name ", dns1123_subdomain_problem(self.name)
        )

    @property
    def path(self) -> str:
        """The pod's API path, each segment percent-encoded."""
        return f"/api/v1/namespaces/{_segment(self.namespace)}/pods/{_segment(self.name)}"


def _prefixed(words: str, problem: str | None) -> str | None:
    return None if problem is None else words + problem


def _segment(value: str) -> str:
    """``value`` percent-encoded as one path segment (``/`` and ``%`` included)."""
    return quote(value, safe="")


def _id_pod(job_id: str) -> PodRef | None:
    """The pod ``k8s:<namespace>/<pod>`` names (parts unchecked), or None for another id."""
    prefix, colon, rest = job_id.partition(":")
    if not colon or prefix not in KUBERNETES_PREFIXES or "/" not in rest:
        return None
    namespace, _, name = rest.partition("/")
    return PodRef(namespace, name)


def pod_of(target: ReclaimTarget) -> PodRef | None:
    """The pod of a Kubernetes job: ``k8s:<namespace>/<pod>``, else its ``namespace`` and
    ``pod`` labels; None for a job that names no pod (``k8s:<pod uid>`` from a cgroup path).
    Unchecked: ``pod_problem`` says whether the driver may act on it."""
    from_id = _id_pod(target.job_id)
    if from_id is not None:
        return from_id
    ns_label, pod_label = target.labels.get("namespace"), target.labels.get("pod")
    if ns_label is not None and pod_label is not None:
        return PodRef(ns_label, pod_label)
    return None


def pod_problem(target: ReclaimTarget) -> str | None:
    """Why the driver refuses to act on ``target``'s pod: a name in its id or labels that no pod
    can have, or labels naming another pod than its id; None when the names are sound."""
    from_id = _id_pod(target.job_id)
    if from_id is not None and (problem := from_id.problem()) is not None:
        return f"job id {target.job_id!r}: {problem}"
    said = {} if from_id is None else {"namespace": from_id.namespace, "pod": from_id.name}
    for key, check in (("namespace", dns1123_label_problem), ("pod", dns1123_subdomain_problem)):
        value = target.labels.get(key)
        if value is None:
            continue
        if (problem := check(value)) is not None:
            return f"label {key}: {problem}"
        if key in said and said[key] != value:
            return f"label {key} {value!r} is not the job id's {said[key]!r}"
    return None


class _Failed(Exception):
    """One request did not go through; ``result`` says how (gone or failed)."""

    def __init__(self, result: ReclaimResult) -> None:
        super().__init__(result.detail)
        self.result = result


class KubernetesDriver:
    """Reclaims a pod's GPUs through the Kubernetes API (see the module docstring for how).

    ``kubeconfig`` names a kubeconfig file (and ``context`` one of its contexts); without it
    the driver uses the pod's own service account (in-cluster). The client is built at the first
    request, so a central without Kubernetes starts as usual and its reclaims answer ``failed``
    with the reason. ``team_label`` is the Namespace label read as the pod's account,
    ``user_label`` the pod label read as its owner (None: no owner is read).
    """

    name = "kubernetes"
    modes = MODES

    def __init__(
        self,
        *,
        kubeconfig: Path | None = None,
        context: str | None = None,
        timeout_seconds: float = 10.0,
        team_label: str = "team",
        user_label: str | None = None,
        start_tolerance_seconds: float = START_TOLERANCE_SECONDS,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.context = context
        self.timeout_seconds = timeout_seconds
        self.team_label = team_label
        self.user_label = user_label
        self.start_tolerance = timedelta(seconds=start_tolerance_seconds)
        self._apis: tuple[CoreV1Api, AppsV1Api] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> KubernetesDriver:
        """The driver the GPUWARDEN_KUBERNETES_* and GPUWARDEN_ACTION_TIMEOUT_SECONDS settings
        describe."""
        return cls(
            kubeconfig=settings.kubernetes_kubeconfig,
            context=settings.kubernetes_context,
            timeout_seconds=settings.action_timeout_seconds,
            team_label=settings.kubernetes_team_label,
            user_label=settings.kubernetes_user_label,
        )

    # --- the client -----------------------------------------------------------------------
    def _clients(self) -> tuple[CoreV1Api, AppsV1Api]:
        with self._lock:
            if self._apis is None:
                self._apis = self._build()
            return self._apis

    def close(self) -> None:
        """Close the API client's connections, if it was ever built."""
        with self._lock:
            if self._apis is not None:
                self._apis[0].api_client.close()
                self._apis = None

    def _build(self) -> tuple[CoreV1Api, AppsV1Api]:
        from kubernetes import client, config

        cfg = client.Configuration()
        try:
            if self.kubeconfig is not None:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=str(self.kubeconfig),
                    context=self.context,
                    client_configuration=cfg,
                )
            else:
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:
            where = (
                f"kubeconfig {self.kubeconfig}"
                if self.kubeconfig is not None
                else "in-cluster config (set GPUWARDEN_KUBERNETES_KUBECONFIG outside a pod)"
            )
            raise _Failed(ReclaimResult("failed", f"no Kubernetes API: {where}: {exc}")) from None
        cfg.retries = 0  # one attempt per request: the ladder's next round is the retry
        # The default, made sure of: every character of a path parameter but letters, digits
        # and "_.-~" is percent-encoded, so a name can never add a path segment.
        cfg.safe_chars_for_path_param = ""
        api = client.ApiClient(cfg)
        return client.CoreV1Api(api), client.AppsV1Api(api)

    def _call(self, what: str, fn: Any, *args: Any, missing: str = "gone", **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` under the timeout; raises _Failed: ``missing`` (gone, or
        failed for an owner that should exist) on 404, failed on anything else, and failed with
        no request sent when a path parameter (every ``str`` of ``args``) is no object's name."""
        from kubernetes.client.exceptions import ApiException, OpenApiException
        from urllib3.exceptions import HTTPError, TimeoutError

        for value in args:
            # Names read from the API (an owner's) reach here unchecked: ".." must never.
            if isinstance(value, str) and (problem := dns1123_subdomain_problem(value)):
                raise _Failed(ReclaimResult("failed", f"{what}: refused, {problem}"))
        try:
            return fn(*args, _request_timeout=self.timeout_seconds, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                outcome: ReclaimOutcome = "gone" if missing == "gone" else "failed"
                raise _Failed(ReclaimResult(outcome, f"{what}: not found (HTTP 404)")) from None
            raise _Failed(ReclaimResult("failed", f"{what}: {_api_error(exc)}")) from None
        except (HTTPError, OpenApiException, OSError, ValueError) as exc:
            # OpenApiException / ValueError: an answer the client could not read as the object.
            reason = getattr(exc, "reason", None)  # MaxRetryError wraps the real cause
            if isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError):
                detail = f"{what}: timed out after {self.timeout_seconds:g} s"
            else:
                cause = reason if isinstance(reason, Exception) else exc
                detail = f"{what}: {type(cause).__name__}: {str(cause)[:200]}"
            raise _Failed(ReclaimResult("failed", detail)) from None

    # --- the re-read the ladder makes before acting -----------------------------------------
    def probe(self, target: ReclaimTarget) -> ProbeResult:
        """What the API says of the job's pod (its node, owner, start and its namespace's team):
        ``gone`` when it no longer exists, has finished or is being deleted; ``mismatch``,
        naming each difference, when its names, node, owner or start are not the job's."""
        problem = pod_problem(target)
        if problem is not None:
            return _refused_probe(target, problem)
        ref = pod_of(target)
        if ref is None:
            return ProbeResult("unknown", _no_pod(target))
        try:
            core, _ = self._clients()
            pod = self._read_pod(core, ref)
            if _deleting(pod):
                return ProbeResult("gone", f"pod {ref} is being deleted")
            facts = self._facts(ref, pod)
            differences = self._differences(facts, target)
            if differences:
                return _refused_probe(target, f"pod {ref} " + "; ".join(differences), facts)
            facts = self._with_account(core, ref, facts)
        except _Failed as exc:
            found: ProbeOutcome = "gone" if exc.result.outcome == "gone" else "unknown"
            return ProbeResult(found, exc.result.detail)
        node = facts.nodes[0] if facts.nodes else None
        return ProbeResult("present", f"pod {ref} runs on {node}", facts)

    def _read_pod(self, core: CoreV1Api, ref: PodRef) -> V1Pod:
        """The pod, read now; _Failed (gone) when it has ended."""
        pod: V1Pod = self._call(f"GET pod {ref}", core.read_namespaced_pod, ref.name, ref.namespace)
        ended = _ended(pod)
        if ended is not None:
            raise _Failed(ReclaimResult("gone", f"pod {ref} {ended}"))
        return pod

    def _facts(self, ref: PodRef, pod: V1Pod) -> SchedulerFacts:
        """What the pod says of the job: its node, owner (the user label) and start."""
        labels = (pod.metadata.labels if pod.metadata is not None else None) or {}
        node = pod.spec.node_name if pod.spec is not None else None
        started = pod.status.start_time if pod.status is not None else None
        return SchedulerFacts(
            job_id=f"k8s:{ref}",
            user=labels.get(self.user_label) if self.user_label else None,
            nodes=(node,) if node else (),
            started_at=_utc(started) if isinstance(started, datetime) else None,
        )

    def _with_account(self, core: CoreV1Api, ref: PodRef, facts: SchedulerFacts) -> SchedulerFacts:
        """``facts`` with the account: the namespace's team label, which its owner cannot set."""
        namespace = self._call(
            f"GET namespace {ref.namespace}", core.read_namespace, ref.namespace, missing="failed"
        )
        labels = (namespace.metadata.labels if namespace.metadata is not None else None) or {}
        return replace(facts, account=labels.get(self.team_label))

    def _differences(self, facts: SchedulerFacts, target: ReclaimTarget) -> list[str]:
        """Each way the pod is not the job GPU Warden recorded (node, owner, start)."""
        out = []
        if target.nodes and not set(facts.nodes) & set(target.nodes):
            # A pod of the same name elsewhere (a StatefulSet's, re-created) is another run.
            where = ", ".join(facts.nodes) or "no node"
            out.append(f"runs on {where}, not on {', '.join(target.nodes)}")
        if target.user and facts.user and facts.user != target.user:
            out.append(f"belongs to {facts.user!r} (label {self.user_label}), not {target.user!r}")
        recorded = _utc(target.started_at) if target.started_at is not None else None
        if recorded and facts.started_at and facts.started_at - recorded > self.start_tolerance:
            out.append(
                f"started {facts.started_at.isoformat()}, after the job recorded at "
                f"{recorded.isoformat()}: a newer pod of the same name"
            )
        return out

    # --- reclaim ----------------------------------------------------------------------------
    def reclaim(self, target: ReclaimTarget, *, dry_run: bool) -> ReclaimResult:
        """Delete the pod or scale its owner to zero (``target.mode``) once it is verified to be
        the job's (names, node, owner, start); never raises."""
        if target.mode not in MODES:
            return ReclaimResult(
                "failed", f"unknown mode {target.mode!r}; the Kubernetes driver does {MODES}"
            )
        problem = pod_problem(target)
        if problem is not None:
            return _refused(target, problem)
        ref = pod_of(target)
        if ref is None:
            return ReclaimResult("failed", _no_pod(target))
        try:
            core, apps = self._clients()
            pod = self._read_pod(core, ref)
            differences = self._differences(self._facts(ref, pod), target)
            if differences:
                return _refused(target, f"pod {ref} " + "; ".join(differences))
            if target.mode == "delete_pod":
                return self._delete(core, ref, pod, dry_run=dry_run)
            return self._scale_to_zero(apps, ref, pod, dry_run=dry_run)
        except _Failed as exc:
            return exc.result

    def _delete(self, core: CoreV1Api, ref: PodRef, pod: V1Pod, *, dry_run: bool) -> ReclaimResult:
        from kubernetes.client import V1DeleteOptions, V1Preconditions

        uid = pod.metadata.uid if pod.metadata is not None else None
        if _deleting(pod):
            return ReclaimResult("reclaimed", f"pod {ref} is already being deleted")
        request = f"DELETE {ref.path} (uid {uid})"
        if dry_run:
            return ReclaimResult("would", request)
        options = V1DeleteOptions(preconditions=V1Preconditions(uid=uid))
        self._call(
            f"DELETE pod {ref}", core.delete_namespaced_pod, ref.name, ref.namespace, body=options
        )
        return ReclaimResult("reclaimed", request)

    def _scale_to_zero(
        self, apps: AppsV1Api, ref: PodRef, pod: V1Pod, *, dry_run: bool
    ) -> ReclaimResult:
        kind, name = self._scalable_owner(apps, ref, pod)
        resource = SCALABLE[kind]
        read = getattr(apps, f"read_namespaced_{_snake(kind)}_scale")
        patch = getattr(apps, f"patch_namespaced_{_snake(kind)}_scale")
        where = f"{kind} {ref.namespace}/{name}"
        scale = self._call(f"GET {where} scale", read, name, ref.namespace, missing="failed")
        before = scale.spec.replicas if scale.spec is not None else None
        path = (
            f"/apis/apps/v1/namespaces/{_segment(ref.namespace)}/{resource}/{_segment(name)}/scale"
        )
        request = f"PATCH {path} {json.dumps(ZERO_REPLICAS, separators=(',', ':'))}"
        if before == 0:
            return ReclaimResult("reclaimed", f"{where} is already scaled to 0")
        if dry_run:
            return ReclaimResult("would", f"{request} (now {before} replicas)")
        self._call(
            f"PATCH {where} scale",
            patch,
            name,
            ref.namespace,
            ZERO_REPLICAS,
            _content_type=MERGE_PATCH,
        )
        return ReclaimResult("reclaimed", f"{request} (was {before} replicas)")

    def _scalable_owner(self, apps: AppsV1Api, ref: PodRef, pod: V1Pod) -> tuple[str, str]:
        """The Deployment or StatefulSet that owns ``pod``: (kind, name), or _Failed saying why
        there is none (a bare pod, a Job's, a DaemonSet's, a custom controller's)."""
        owner = _controller(pod.metadata)
        if owner is not None and owner.kind == "ReplicaSet":
            rs = self._call(
                f"GET ReplicaSet {ref.namespace}/{owner.name}",
                apps.read_namespaced_replica_set,
                owner.name,
                ref.namespace,
                missing="failed",
            )
            above = _controller(rs.metadata)
            if above is None or above.kind != "Deployment":
                raise _Failed(
                    ReclaimResult(
                        "failed",
                        f"pod {ref}: ReplicaSet {owner.name} has no Deployment to scale; "
                        "use mode delete_pod",
                    )
                )
            owner = above
        if owner is None or owner.kind not in SCALABLE:
            what = "no controller" if owner is None else f"controller {owner.kind} {owner.name}"
            raise _Failed(
                ReclaimResult(
                    "failed",
                    f"pod {ref} has {what}; scale_to_zero scales a Deployment or StatefulSet "
                    "(use mode delete_pod, or an action webhook)",
                )
            )
        return owner.kind, owner.name


def _controller(meta: Any) -> Any:
    """The ownerReference with ``controller: true`` of an object's metadata, or None."""
    refs = (meta.owner_references if meta is not None else None) or []
    return next((r for r in refs if r.controller), None)


def _ended(pod: V1Pod) -> str | None:
    """Why the pod no longer holds the job's GPUs (it finished), or None."""
    phase = pod.status.phase if pod.status is not None else None
    if phase in ("Succeeded", "Failed"):
        return f"has ended ({phase})"
    return None


def _deleting(pod: V1Pod) -> bool:
    """Whether the pod is being deleted (it holds its GPUs until its containers stop)."""
    return pod.metadata is not None and pod.metadata.deletion_timestamp is not None


def _utc(when: datetime) -> datetime:
    """``when`` as an aware UTC time (a naive one is read as UTC, as the stores keep it)."""
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _refused_probe(
    target: ReclaimTarget, why: str, facts: SchedulerFacts | None = None
) -> ProbeResult:
    """A re-read that found a pod that is not the job's: logged, and a mismatch with the reason."""
    log.warning("the Kubernetes driver refuses job %s: %s", target.job_id, why)
    return ProbeResult("mismatch", f"refused: {why}", facts)


def _refused(target: ReclaimTarget, why: str) -> ReclaimResult:
    """A reclaim refused before any change: logged, and failed with the reason."""
    log.warning("the Kubernetes driver refuses to reclaim job %s: %s", target.job_id, why)
    return ReclaimResult("failed", f"refused: {why}")


def _no_pod(target: ReclaimTarget) -> str:
    return (
        f"job {target.job_id} names no pod: the Kubernetes driver needs k8s:<namespace>/<pod> "
        "or the labels namespace and pod"
    )


def _snake(kind: str) -> str:
    return {"Deployment": "deployment", "StatefulSet": "stateful_set"}[kind]


def _api_error(exc: Any) -> str:
    """``HTTP 409 Conflict: <the API server's message>`` of an ApiException."""
    message = ""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        message = str(exc.body or "")[:200]
    text = f"HTTP {exc.status} {exc.reason or ''}".rstrip()
    return f"{text}: {message[:300]}" if message else text
