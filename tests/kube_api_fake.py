"""A stand-in for the Kubernetes API server (the one part we fake), on a real HTTP server on
loopback: the few routes the Kubernetes reclaim driver calls, answered as the API server answers
them (the objects as JSON, errors as a ``Status``), every request recorded.

It holds namespaces (with labels), pods, ReplicaSets and the scale of Deployments and
StatefulSets; a DELETE honours
``preconditions.uid`` (409 otherwise) and marks the pod terminating, a merge PATCH of a
``scale`` sets its replicas. ``fail`` scripts an error answer for the next request matching a
method and a path; ``delay_seconds`` slows every answer (a timeout).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from tests.receivers import LoopbackHttp

TOKEN = "fake-service-account-token"
# When a pod added without ``started`` started: an hour before the tests' clock starts.
POD_STARTED = "2026-12-02T07:00:00Z"
_NAMESPACE = re.compile(r"^/api/v1/namespaces/([^/]+)$")
_POD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$")
_RS = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/replicasets/([^/]+)$")
_SCALE = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/(deployments|statefulsets)/([^/]+)/scale$")
_KIND = {"deployments": "Deployment", "statefulsets": "StatefulSet"}


@dataclass
class ApiRequest:
    """One request the fake API server got."""

    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str | None
    body: Any  # the parsed JSON body, or None


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``Status`` document as the API server answers errors."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _owner(kind: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": name,
        "uid": str(uuid.uuid4()),
        "controller": True,
        "blockOwnerDeletion": True,
    }


@dataclass
class FakeKubeApi(LoopbackHttp):
    """The API server's answers for namespaces, pods, ReplicaSets and scale subresources (see
    module)."""

    delay_seconds: float = 0.0
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> labels
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    replicasets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    scales: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (ns, kind, name)
    fail: list[tuple[str, str, int]] = field(default_factory=list)  # (method, path, status)
    requests: list[ApiRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                outer.requests.append(
                    ApiRequest(
                        self.command,
                        parts.path,
                        parse_qs(parts.query),
                        self.headers.get("content-type"),
                        json.loads(raw) if raw else None,
                    )
                )
                time.sleep(outer.delay_seconds)
                code, doc = outer.answer(self.command, parts.path, self.headers, raw)
                body = json.dumps(doc).encode()
                try:
                    self.send_response(code)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a timeout test)

            do_GET = do_DELETE = do_PATCH = do_POST = do_PUT = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self.serve(Handler)

    def kubeconfig(self, directory: Path) -> Path:
        """A kubeconfig file for this server with a bearer token, as a site's would be."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "gpuwarden", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "gpuwarden"}}],
            "current-context": "fake",
        }
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump(doc))
        return path

    # --- the cluster's objects -------------------------------------------------------------
    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str = "node-a",
        owner: tuple[str, str] | None = None,
        phase: str = "Running",
        labels: dict[str, str] | None = None,
        started: str = POD_STARTED,
    ) -> str:
        """A running pod holding a GPU, owned by ``(kind, name)``, started at ``started`` (in
        a namespace of that name, made without labels if missing); its uid."""
        uid = str(uuid.uuid4())
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if owner is not None:
            meta["ownerReferences"] = [_owner(*owner)]
        if labels:
            meta["labels"] = dict(labels)
        self.namespaces.setdefault(namespace, {})
        self.pods[(namespace, name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "train",
                        "image": "pytorch/pytorch",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
            "status": {"phase": phase, "startTime": started},
        }
        return uid

    def add_namespace(self, name: str, labels: dict[str, str]) -> None:
        """A namespace with ``labels`` (a site's ``team`` label, say)."""
        self.namespaces[name] = dict(labels)

    def add_deployment(self, namespace: str, name: str, *, replicas: int = 2) -> str:
        """A Deployment at ``replicas`` and its current ReplicaSet; the ReplicaSet's name."""
        rs = f"{name}-7d9f8c6b5"
        self.replicasets[(namespace, rs)] = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": rs,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "ownerReferences": [_owner("Deployment", name)],
            },
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}},
        }
        self.scales[(namespace, "deployments", name)] = replicas
        return rs

    def add_statefulset(self, namespace: str, name: str, *, replicas: int = 1) -> None:
        """A StatefulSet at ``replicas``."""
        self.scales[(namespace, "statefulsets", name)] = replicas

    # --- the answers ---------------------------------------------------------------------
    def answer(self, method: str, path: str, headers: Any, raw: bytes) -> tuple[int, Any]:
        """(HTTP status, JSON document) for one request."""
        if headers.get("authorization") != f"Bearer {TOKEN}":
            return 401, status(401, "Unauthorized", "Unauthorized")
        for i, (m, p, code) in enumerate(self.fail):
            if m == method and p == path:
                del self.fail[i]
                return code, status(code, _REASONS.get(code, "InternalError"), f"scripted {code}")
        body = json.loads(raw) if raw else None
        if (m_ns := _NAMESPACE.match(path)) and method == "GET":
            return self._namespace(m_ns.group(1))
        if m_pod := _POD.match(path):
            return self._pod(method, m_pod.group(1), m_pod.group(2), body)
        if (m_rs := _RS.match(path)) and method == "GET":
            rs = self.replicasets.get((m_rs.group(1), m_rs.group(2)))
            if rs is None:
                return 404, status(404, "NotFound", f'replicasets.apps "{m_rs.group(2)}" not found')
            return 200, rs
        if m_scale := _SCALE.match(path):
            ns, resource, name = m_scale.groups()
            return self._scale(method, ns, resource, name, headers, body)
        return 404, status(404, "NotFound", "the server could not find the requested resource")

    def _namespace(self, name: str) -> tuple[int, Any]:
        if name not in self.namespaces:
            return 404, status(404, "NotFound", f'namespaces "{name}" not found')
        meta: dict[str, Any] = {"name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name))}
        if self.namespaces[name]:
            meta["labels"] = self.namespaces[name]
        doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}
        return 200, doc | {"spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}

    def _pod(self, method: str, ns: str, name: str, body: Any) -> tuple[int, Any]:
        pod = self.pods.get((ns, name))
        if pod is None:
            return 404, status(404, "NotFound", f'pods "{name}" not found')
        if method == "GET":
            return 200, pod
        if method != "DELETE":
            return 405, status(405, "MethodNotAllowed", f"{method} is not allowed here")
        want = ((body or {}).get("preconditions") or {}).get("uid")
        if want is not None and want != pod["metadata"]["uid"]:
            message = (
                f"Precondition failed: UID in precondition: {want}, "
                f"UID in object meta: {pod['metadata']['uid']}"
            )
            return 409, status(409, "Conflict", message)
        # A graceful delete: the pod stays, terminating, until its containers have stopped.
        pod["metadata"]["deletionTimestamp"] = "2026-12-04T12:02:00Z"
        pod["metadata"]["deletionGracePeriodSeconds"] = 30
        return 200, pod

    def _scale(
        self, method: str, ns: str, resource: str, name: str, headers: Any, body: Any
    ) -> tuple[int, Any]:
        key = (ns, resource, name)
        if key not in self.scales:
            return 404, status(404, "NotFound", f'{resource}.apps "{name}" not found')
        if method == "PATCH":
            if headers.get("content-type") != "application/merge-patch+json":
                return 415, status(415, "UnsupportedMediaType", "expected a merge patch")
            replicas = ((body or {}).get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                return 422, status(422, "Invalid", "spec.replicas must be a non-negative int")
            self.scales[key] = replicas
        elif method != "GET":
            return 405, status(405, "MethodNotAllowed", f"{method} is not allowed here")
        return 200, {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {"name": name, "namespace": ns, "uid": str(uuid.uuid4())},
            "spec": {"replicas": self.scales[key]},
            "status": {"replicas": self.scales[key], "selector": f"app={name}"},
        }


_REASONS = {409: "Conflict", 500: "InternalError", 503: "ServiceUnavailable", 403: "Forbidden"}
