"""Reading deploy/kubernetes as kustomize would: the manifests and the components' patches."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

K8S = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"


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
