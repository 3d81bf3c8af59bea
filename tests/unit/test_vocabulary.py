from __future__ import annotations

from pathlib import Path

from service.db.schema import rollup_1m, samples
from service.vocabulary import METRICS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()


def test_every_metric_is_documented_and_stored() -> None:
    for m in METRICS:
        assert f"`{m.name}`" in DOC, m.name
        assert m.name in samples.c
        assert f"{m.name}_sum" in rollup_1m.c and f"{m.name}_count" in rollup_1m.c


def test_names_carry_units() -> None:
    for m in METRICS:
        if m.unit in ("bytes", "watts", "joules", "celsius", "hertz", "bytes_per_second"):
            suffix = {"hertz": "hz", "bytes_per_second": "bytes_per_second"}.get(m.unit, m.unit)
            assert m.name.endswith(suffix), m.name
