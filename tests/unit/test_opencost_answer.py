"""OpenCost's /allocation/compute answer read into per-node GPU prices and mapped to GPU models:
the recorded real answer (a cluster without GPUs) prices nothing; bad answers are refused."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from service.costs.opencost import (
    NodeGpuCost,
    OpenCostAnswerError,
    model_prices,
    node_gpu_costs,
    pattern_of,
)
from service.costs.prices import matches, price_at

RECORDED = Path(__file__).resolve().parents[1] / "data" / "opencost"
FROM = datetime(2000, 1, 1, tzinfo=UTC)


def recorded() -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(
        (RECORDED / "allocation-compute-by-namespace.json").read_text()
    )
    return answer


def test_the_recorded_answer_of_a_cluster_without_gpus_prices_nothing() -> None:
    answer = recorded()
    assert answer["code"] == 200 and len(answer["data"][0]) == 3
    assert node_gpu_costs(answer) == []


def test_gpu_hours_and_cost_sum_per_node_over_sets_and_allocations() -> None:
    answer = recorded()
    gpu = copy.deepcopy(answer["data"][0]["opencost"])
    gpu.update(gpuCount=2, gpuHours=10.0, gpuCost=30.0, gpuCostAdjustment=-5.0)
    other = copy.deepcopy(gpu)
    other.update(gpuHours=6.0, gpuCost=18.0, gpuCostAdjustment=0)
    answer["data"] = [{"a": gpu}, {"b": other}]  # two sets (a step shorter than the window)
    (node,) = node_gpu_costs(answer)
    assert node.node == "ip-192-168-20-42.ap-southeast-2.compute.internal"
    assert (node.gpu_hours, node.gpu_cost_usd) == (16.0, 43.0)
    assert node.usd_per_gpu_hour == pytest.approx(43.0 / 16.0)


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ([], "not a JSON object"),
        ({"code": 500, "message": "prometheus down"}, "prometheus down"),
        ({"code": 200, "data": {}}, "data is not a list"),
        ({"code": 200, "data": [{"x": {"properties": {"node": "n"}, "gpuHours": "lots"}}]},
         "gpuHours"),
    ],
)  # fmt: skip
def test_a_bad_answer_is_refused_with_what_is_wrong(answer: object, says: str) -> None:
    with pytest.raises(OpenCostAnswerError, match=says):
        node_gpu_costs(answer)


def test_nodes_map_to_models_by_full_or_short_name() -> None:
    costs = [
        NodeGpuCost("ip-10-2-16-238.eu-west-1.compute.internal", 24.0, 12.62),
        NodeGpuCost("gpu-b", 16.0, 64.0),
        NodeGpuCost("gpu-c", 8.0, 40.0),  # same model as gpu-b: summed with it
        NodeGpuCost("mixed", 8.0, 8.0),  # two models: which is which? none
        NodeGpuCost("unknown", 8.0, 8.0),
    ]
    models = {
        "ip-10-2-16-238": {"Tesla T4"},
        "gpu-b": {"NVIDIA H100 80GB HBM3"},
        "GPU-C.cluster.local": {"NVIDIA H100 80GB HBM3"},
        "mixed": {"NVIDIA A10G", "Tesla T4"},
    }
    rows = model_prices(costs, models, effective_from=FROM, where="http://oc:9003")
    by_pattern = {r.model_pattern: r for r in rows}
    assert set(by_pattern) == {"NVIDIA H100 80GB HBM3", "Tesla T4"}
    assert by_pattern["Tesla T4"].usd_per_gpu_hour == 0.53  # 12.62 / 24, to the cent
    assert by_pattern["NVIDIA H100 80GB HBM3"].usd_per_gpu_hour == 4.33  # 104 / 24
    note = by_pattern["NVIDIA H100 80GB HBM3"].note or ""
    assert "OpenCost http://oc:9003" in note and "gpu-b, gpu-c" in note
    # The row prices its model and nothing else, a MIG slice by its share of it.
    assert price_at(rows, "NVIDIA H100 80GB HBM3", FROM) is not None
    assert price_at(rows, "NVIDIA H100 PCIe", FROM) is None
    mig = price_at(rows, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", FROM)
    assert mig is not None and mig.usd_per_gpu_hour == pytest.approx(4.33 / 7)


def test_a_model_name_with_wildcard_characters_is_matched_literally() -> None:
    assert pattern_of("GPU [x]*") == "GPU [[]x][*]"
    assert matches(pattern_of("GPU [x]*"), "GPU [x]*")
    assert not matches(pattern_of("GPU [x]*"), "GPU x-anything")


def test_the_opencost_url_setting_must_be_http() -> None:
    from pydantic import ValidationError

    from service.settings import Settings

    with pytest.raises(ValidationError, match="opencost_url"):
        Settings(opencost_url="opencost:9003")
    assert Settings(opencost_url="").opencost_url is None
    assert Settings(opencost_url="http://opencost.opencost.svc:9003").opencost_url is not None
