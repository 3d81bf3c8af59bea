"""GPU prices from an OpenCost ``/allocation/compute`` answer: per node, gpuCost / gpuHours, mapped
to the GPU models GPU Warden knows on those nodes.

Pure: takes the decoded JSON answer and the nodes' models, returns price rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from service.costs.prices import PriceRow

# OpenCost's per-node price is averaged over its window: rounded to the cent, so a day's sums
# (whose basis digests the price table) are not re-summed for every hourly wobble.
PRICE_DIGITS = 2


@dataclass(frozen=True, slots=True)
class NodeGpuCost:
    """What OpenCost says one node's GPUs cost over its window: GPU-hours and their USD."""

    node: str
    gpu_hours: float
    gpu_cost_usd: float

    @property
    def usd_per_gpu_hour(self) -> float:
        """The node's price per GPU-hour."""
        return self.gpu_cost_usd / self.gpu_hours


class OpenCostAnswerError(ValueError):
    """An answer that is not an OpenCost allocation answer; the message says what is wrong."""


def _number(alloc: Mapping[str, object], name: str) -> float:
    """A numeric field of an allocation (0 where absent or null)."""
    value = alloc.get(name)
    if value is None:
        return 0.0
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise OpenCostAnswerError(f"{name} is {value!r}, not a number")
    return float(value)


def node_gpu_costs(answer: object) -> list[NodeGpuCost]:
    """Each node's GPU-hours and GPU cost (gpuCost + gpuCostAdjustment) summed over every set
    and allocation of an ``/allocation/compute`` answer (``{"code": 200, "data": [{name:
    allocation}, ...]}``); nodes without GPU-hours or cost are left out."""
    if not isinstance(answer, Mapping):
        raise OpenCostAnswerError("the answer is not a JSON object")
    code = answer.get("code")
    if code is not None and code != 200:
        raise OpenCostAnswerError(f"code {code!r}: {answer.get('message') or answer.get('status')}")
    sets = answer.get("data")
    if not isinstance(sets, list):
        raise OpenCostAnswerError("data is not a list of allocation sets")
    hours: dict[str, float] = {}
    cost: dict[str, float] = {}
    for allocations in sets:
        if allocations is None:
            continue
        if not isinstance(allocations, Mapping):
            raise OpenCostAnswerError("an allocation set is not an object")
        for name, alloc in allocations.items():
            if not isinstance(alloc, Mapping):
                raise OpenCostAnswerError(f"allocation {name!r} is not an object")
            props = alloc.get("properties")
            node = props.get("node") if isinstance(props, Mapping) else None
            if not isinstance(node, str) or not node:
                continue  # an allocation of no one node (a namespace's, __idle__ of a cluster)
            hours[node] = hours.get(node, 0.0) + _number(alloc, "gpuHours")
            cost[node] = (
                cost.get(node, 0.0)
                + _number(alloc, "gpuCost")
                + _number(alloc, "gpuCostAdjustment")
            )
    return [
        NodeGpuCost(node, hours[node], cost[node])
        for node in sorted(hours)
        if hours[node] > 0 and cost[node] > 0
    ]


def short_name(node: str) -> str:
    """A node's name before its first dot (ip-10-2-16-238 of ip-10-2-16-238.eu-west-1...)."""
    return node.split(".", 1)[0].lower()


def pattern_of(model: str) -> str:
    """A price pattern matching exactly ``model`` (shell wildcards in it taken literally)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in model)


def model_prices(
    costs: Iterable[NodeGpuCost],
    models_of_node: Mapping[str, set[str]],
    *,
    effective_from: datetime,
    where: str,
) -> list[PriceRow]:
    """One price row per GPU model on the nodes OpenCost priced: the model's GPU cost over its
    GPU-hours (summed over those nodes), matched to GPU Warden's nodes by name or by the name
    before the first dot; a node with GPUs of several models prices none (which is which?)."""
    known = {short_name(n): ms for n, ms in models_of_node.items()}
    known.update({n.lower(): ms for n, ms in models_of_node.items()})
    hours: dict[str, float] = {}
    usd: dict[str, float] = {}
    nodes: dict[str, list[str]] = {}
    for c in costs:
        models = known.get(c.node.lower()) or known.get(short_name(c.node))
        if not models or len(models) != 1:
            continue
        (model,) = models
        hours[model] = hours.get(model, 0.0) + c.gpu_hours
        usd[model] = usd.get(model, 0.0) + c.gpu_cost_usd
        nodes.setdefault(model, []).append(c.node)
    return [
        PriceRow(
            pattern_of(model),
            round(usd[model] / hours[model], PRICE_DIGITS),
            effective_from,
            f"OpenCost {where}: {usd[model]:.2f} USD / {hours[model]:.2f} GPU-h on "
            + ", ".join(sorted(nodes[model])),
        )
        for model in sorted(hours)
    ]
