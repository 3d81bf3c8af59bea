"""Reading deploy/kubernetes as kustomize would (the manifests and the components' patches), and
checking requests to the Kubernetes API against its OpenAPI document and an RBAC role."""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

K8S = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
OPENAPI = Path(__file__).resolve().parent / "data" / "kubernetes-openapi" / "swagger-reclaim.json"


def daemonset() -> dict[str, Any]:
    """The agent DaemonSet as written."""
    doc: dict[str, Any] = yaml.safe_load((K8S / "agent-daemonset.yaml").read_text())
    return doc


def component(name: str) -> dict[str, Any]:
    """A kustomize component of deploy/kubernetes/components."""
    doc: dict[str, Any] = yaml.safe_load(
        (K8S / "components" / name / "kustomization.yaml").read_text()
    )
    assert doc["kind"] == "Component"
    return doc


def _merge(base: Any, patch: Any) -> Any:
    """A strategic merge as kustomize does it for what our patches touch: maps merge, lists of
    named items (containers, env) merge by name, other values replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = _merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in base + patch)
    ):
        out_list = [copy.deepcopy(i) for i in base]
        for item in patch:
            for i, old in enumerate(out_list):
                if old["name"] == item["name"]:
                    out_list[i] = _merge(old, item)
                    break
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)


def _json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        *parents, last = op["path"].strip("/").split("/")
        node: Any = out
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[last] = op["value"]
    return out


def apply_component(doc: dict[str, Any], comp: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with every patch of ``comp`` that targets it applied."""
    for patch in comp["patches"]:
        target = patch["target"]
        if target["kind"] != doc["kind"] or target["name"] != doc["metadata"]["name"]:
            continue
        body = yaml.safe_load(patch["patch"])
        doc = _json_patch(doc, body) if isinstance(body, list) else _merge(doc, body)
    return doc


def strict(schema: Any) -> Any:
    """``schema`` refusing unknown fields, as the API server does under strict field validation."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def openapi() -> dict[str, Any]:
    """The kept part of Kubernetes' OpenAPI v2 document (tests/data/kubernetes-openapi)."""
    doc: dict[str, Any] = json.loads(OPENAPI.read_text())
    return doc


def operation(method: str, path: str) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """(path template, operation, its parameters resolved) of a request; AssertionError when
    the document has no such path or no such method on it."""
    doc = openapi()
    for template, item in doc["paths"].items():
        pattern = "^" + re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            op = item.get(method.lower())
            assert op is not None, f"{method} {path}: {template} has no {method}"
            params = [_resolve(p) for p in item.get("parameters", []) + op.get("parameters", [])]
            return template, op, params
    raise AssertionError(f"{method} {path}: no such path in the Kubernetes OpenAPI kept")


def _resolve(param: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in param:
        found: dict[str, Any] = openapi()["parameters"][param["$ref"].rsplit("/", 1)[1]]
        return found
    return param


def validate_schema(instance: Any, ref: str) -> None:
    """Raise jsonschema.ValidationError unless ``instance`` is a valid ``ref`` (strictly)."""
    doc = openapi()
    schema = {"$ref": ref, "definitions": strict(doc["definitions"])}
    jsonschema.Draft4Validator(schema).validate(instance)


def check_request(
    method: str, path: str, query: dict[str, list[str]], content_type: str | None, body: Any
) -> str:
    """Check one request against the OpenAPI document: the path has that method, every query
    parameter is declared, the content type is one the operation consumes, and the body is
    valid for its schema (a merge patch: for the schema the path serves, every field
    optional). Returns the path template; AssertionError or ValidationError otherwise."""
    template, op, params = operation(method, path)
    declared = {p["name"] for p in params if p["in"] == "query"}
    assert set(query) <= declared, f"{method} {path}: undeclared {set(query) - declared}"
    bodies = [p for p in params if p["in"] == "body"]
    if body is None:
        assert not any(p.get("required") for p in bodies), f"{method} {path}: body required"
        return template
    assert bodies, f"{method} {path}: the operation takes no body"
    consumes = op.get("consumes", ["*/*"])
    assert "*/*" in consumes or content_type in consumes, f"{content_type} not in {consumes}"
    validate_schema(body, bodies[0]["schema"]["$ref"])
    if content_type == "application/merge-patch+json":
        served = openapi()["paths"][template]["get"]["responses"]["200"]["schema"]["$ref"]
        validate_schema(body, served)
    return template


_API_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)/namespaces/[^/]+/(?P<resource>[^/]+)/[^/]+"
    r"(?:/(?P<sub>[^/]+))?$"
)
# A Namespace object itself (cluster-scoped): RBAC's resource is "namespaces".
_NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces/[^/]+$")
VERBS = {"GET": "get", "DELETE": "delete", "PATCH": "patch", "PUT": "update", "POST": "create"}


def rbac_need(method: str, path: str) -> tuple[str, str, str]:
    """(apiGroup, resource[/subresource], verb) that RBAC checks for a request."""
    if _NAMESPACE_PATH.match(path):
        return "", "namespaces", VERBS[method]
    m = _API_PATH.match(path)
    assert m is not None, path
    resource = m["resource"] + (f"/{m['sub']}" if m["sub"] else "")
    return m["group"] or "", resource, VERBS[method]


def rbac_grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Every (apiGroup, resource, verb) a Role's rules grant (no wildcards allowed)."""
    out = set()
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"a wildcard in {field}: not least privilege"
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out
