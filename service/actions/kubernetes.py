"""Kubernetes reclaim driver: delete a job's pod, or scale the Deployment or StatefulSet that owns
it to zero, through the official ``kubernetes`` client.

A Kubernetes job is a pod, ``k8s:<namespace>/<pod>`` (the kubelet's pod resources and
dcgm-exporter's pod labels name it so); the job's ``namespace`` and ``pod`` labels say the same
where the id does not. The requests, each under the configured timeout and never retried here
(the ladder tries again on a later round):

- read: ``GET /api/v1/namespaces/{ns}/pods/{pod}``;
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.actions.base import (
    ProbeOutcome,
    ProbeResult,
    ReclaimOutcome,
    ReclaimResult,
    ReclaimTarget,
)

if TYPE_CHECKING:
    from kubernetes.client import AppsV1Api, CoreV1Api, V1Pod

log = logging.getLogger(__name__)

MODES = ("delete_pod", "scale_to_zero")
# The owners scale_to_zero can scale, as the pod's controller reference names them.
SCALABLE = {"Deployment": "deployments", "StatefulSet": "statefulsets"}
MERGE_PATCH = "application/merge-patch+json"
ZERO_REPLICAS: dict[str, Any] = {"spec": {"replicas": 0}}


@dataclass(frozen=True)
class PodRef:
    """A pod by namespace and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_of(target: ReclaimTarget) -> PodRef | None:
    """The pod of a Kubernetes job: ``k8s:<namespace>/<pod>``, else its ``namespace`` and
    ``pod`` labels; None for a job that names no pod (``k8s:<pod uid>`` from a cgroup path)."""
    if target.job_id.startswith("k8s:") and "/" in target.job_id:
        namespace, _, name = target.job_id[len("k8s:") :].partition("/")
        if namespace and name and "/" not in name:
            return PodRef(namespace, name)
    ns_label, pod_label = target.labels.get("namespace"), target.labels.get("pod")
    if ns_label and pod_label:
        return PodRef(ns_label, pod_label)
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
    with the reason.
    """

    name = "kubernetes"
    modes = MODES

    def __init__(
        self,
        *,
        kubeconfig: Path | None = None,
        context: str | None = None,
        timeout_seconds: float = 10.0,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.context = context
        self.timeout_seconds = timeout_seconds
        self._apis: tuple[CoreV1Api, AppsV1Api] | None = None
        self._lock = threading.Lock()

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
        api = client.ApiClient(cfg)
        return client.CoreV1Api(api), client.AppsV1Api(api)

    def _call(self, what: str, fn: Any, *args: Any, missing: str = "gone", **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` under the timeout; raises _Failed: ``missing`` (gone, or
        failed for an owner that should exist) on 404, failed on anything else."""
        from kubernetes.client.exceptions import ApiException, OpenApiException
        from urllib3.exceptions import HTTPError, TimeoutError

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
        """Whether the job's pod still holds its GPUs where the job was seen: ``gone`` when it
        no longer exists, has finished, is being deleted or now runs on another node."""
        ref = pod_of(target)
        if ref is None:
            return ProbeResult("unknown", _no_pod(target))
        try:
            core, _ = self._clients()
            pod = self._live_pod(core, ref, target)
        except _Failed as exc:
            found: ProbeOutcome = "gone" if exc.result.outcome == "gone" else "unknown"
            return ProbeResult(found, exc.result.detail)
        if pod.metadata is not None and pod.metadata.deletion_timestamp is not None:
            return ProbeResult("gone", f"pod {ref} is being deleted")
        node = pod.spec.node_name if pod.spec is not None else None
        return ProbeResult("present", f"pod {ref} runs on {node}")

    def _live_pod(self, core: CoreV1Api, ref: PodRef, target: ReclaimTarget) -> V1Pod:
        """The pod, read now; _Failed (gone) when it has ended or runs on another node."""
        pod: V1Pod = self._call(f"GET pod {ref}", core.read_namespaced_pod, ref.name, ref.namespace)
        ended = _ended(pod, target)
        if ended is not None:
            raise _Failed(ReclaimResult("gone", f"pod {ref} {ended}"))
        return pod

    # --- reclaim ----------------------------------------------------------------------------
    def reclaim(self, target: ReclaimTarget, *, dry_run: bool) -> ReclaimResult:
        """Delete the pod or scale its owner to zero (``target.mode``); never raises."""
        if target.mode not in MODES:
            return ReclaimResult(
                "failed", f"unknown mode {target.mode!r}; the Kubernetes driver does {MODES}"
            )
        ref = pod_of(target)
        if ref is None:
            return ReclaimResult("failed", _no_pod(target))
        try:
            core, apps = self._clients()
            pod = self._live_pod(core, ref, target)
            if target.mode == "delete_pod":
                return self._delete(core, ref, pod, dry_run=dry_run)
            return self._scale_to_zero(apps, ref, pod, dry_run=dry_run)
        except _Failed as exc:
            return exc.result

    def _delete(self, core: CoreV1Api, ref: PodRef, pod: V1Pod, *, dry_run: bool) -> ReclaimResult:
        from kubernetes.client import V1DeleteOptions, V1Preconditions

        uid = pod.metadata.uid if pod.metadata is not None else None
        if pod.metadata is not None and pod.metadata.deletion_timestamp is not None:
            return ReclaimResult("reclaimed", f"pod {ref} is already being deleted")
        request = f"DELETE /api/v1/namespaces/{ref.namespace}/pods/{ref.name} (uid {uid})"
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
        path = f"/apis/apps/v1/namespaces/{ref.namespace}/{resource}/{name}/scale"
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


def _ended(pod: V1Pod, target: ReclaimTarget) -> str | None:
    """Why the pod no longer holds the job's GPUs (finished, or on another node), or None."""
    phase = pod.status.phase if pod.status is not None else None
    if phase in ("Succeeded", "Failed"):
        return f"has ended ({phase})"
    node = pod.spec.node_name if pod.spec is not None else None
    if target.nodes and node not in target.nodes:
        # A pod of the same name elsewhere (a StatefulSet's, re-created) is another run.
        return f"now runs on {node or 'no node'}, not on {', '.join(target.nodes)}"
    return None


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
