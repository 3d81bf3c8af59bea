"""docs/prometheus-grafana.md says of each series what the real /metrics says: the type of every
per-GPU family in its table, and the type the dcgm-exporter compat mode gives the energy counter."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from sqlalchemy import Engine

from service.settings import Settings
from service.vocabulary import METRICS
from tests.integration.metrics_support import ingest
from tests.support import FakeClock, live_server, make_batch

DOC = Path(__file__).resolve().parents[2] / "docs" / "prometheus-grafana.md"


def exposition_types(
    engine: Engine, settings: Settings, clock: FakeClock, token: str
) -> dict[str, str]:
    """Family name -> ``# TYPE`` of a real /metrics (compat mode on) with every metric reported."""
    from service.api.app import create_app

    app = create_app(
        settings.model_copy(update={"metrics_dcgm_compat": True}), engine=engine, clock=clock
    )
    values = {m.name: (1 if m.kind == "int" else 0.5) for m in METRICS}
    with live_server(app) as url, httpx.Client(base_url=url) as http:
        ingest(http, token, make_batch(start=clock(), metrics=values))
        text = http.get("/metrics").text
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))


def per_gpu_table() -> list[tuple[str, str]]:
    """(series, type) of each row of the doc's per-GPU series table."""
    section = DOC.read_text().split("### Per-GPU series", 1)[1].split("\n### ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`gpuwarden_"):
            rows.append((cells[0].split("`")[1], cells[1]))
    return rows


def test_the_documented_types_are_the_exposition_s(
    engine: Engine, settings: Settings, clock: FakeClock, tokens: dict[str, str]
) -> None:
    types = exposition_types(engine, settings, clock, tokens["agent"])
    rows = per_gpu_table()
    assert len(rows) >= 25 and ("gpuwarden_gpu_energy_joules_total", "counter") in rows
    for series, documented in rows:
        # The text format names a counter's TYPE line as its samples: with ``_total``.
        assert types.get(series) == documented, (series, documented, types.get(series))
    # The compat sentence: dcgm-exporter's energy field, typed as the exposition types it.
    said = re.search(r"`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` is typed (\w+)", DOC.read_text())
    assert said is not None
    assert said.group(1) == types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    for name in ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"):
        assert f"`{name}`" in said.string and types[name] == "counter", name
