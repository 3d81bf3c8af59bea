"""Prices from the YAML config file, and job_waste_usd (the hook the alerting calls)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from service import settings as settings_module
from service.costs.prices import PriceRow
from service.db import jobs_repo, prices_repo
from service.errors import ConfigError
from service.settings import Settings
from service.usecases import price_table
from service.usecases.job_summary import job_waste_usd
from tests.integration.cost_data import roll_up, store_series, worked_example_metrics
from tests.support import FakeClock

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


def test_config_file_prices_apply_until_a_table_is_put(engine: Engine, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("H100_PRICE", "3.5")
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(
        "prices:\n"
        "  - {model_pattern: '*H100*', usd_per_gpu_hour: '${H100_PRICE}', effective_from: 2026-01-01}\n"
        "  - model_pattern: '*L4'\n    usd_per_gpu_hour: 0.7\n"
        "    effective_from: '2026-06-01T00:00:00Z'\n    note: our contract\n"
    )
    settings = Settings(config=path)
    with engine.begin() as conn:
        table = price_table.effective_prices(conn, settings)
        assert table.source == "config"
        assert [(r.model_pattern, r.usd_per_gpu_hour) for r in table.rows] == [
            ("*H100*", 3.5),
            ("*L4", 0.7),
        ]
        assert table.rows[0].effective_from == datetime(2026, 1, 1, tzinfo=UTC)
        prices_repo.replace_prices(conn, rows=[PriceRow("*H100*", 9.0, T0)])
        assert price_table.effective_prices(conn, settings).source == "api"
    path.write_text("prices:\n  - {model_pattern: '*H100*', effective_from: 2026-01-01}\n")
    with engine.begin() as conn:
        prices_repo.replace_prices(conn, rows=[])
        with pytest.raises(ConfigError, match=r"prices\.0"):
            price_table.effective_prices(conn, settings)


def test_job_waste_usd_has_the_alerting_signature(engine: Engine, clock: FakeClock):
    store_series(engine, clock, uuid="GPU-a0", start=T0, metrics=worked_example_metrics())
    roll_up(engine)
    with engine.begin() as conn:
        prices_repo.replace_prices(conn, rows=[PriceRow("*H100*", 4.0, T0 - timedelta(days=1))])
        jobs_repo.upsert_job(
            conn,
            job_id="j",
            fields={},
            gpu_uuids=["GPU-a0"],
            started_at=T0,
            ended_at=None,
            now=clock(),
        )
    with engine.connect() as conn:
        # Half an hour in: all of it idle so far.
        half = job_waste_usd(conn, job_id="j", now=T0 + timedelta(minutes=30), settings=Settings())
        assert half == pytest.approx(2.0)
        full = job_waste_usd(conn, job_id="j", now=T0 + timedelta(hours=1), settings=Settings())
        assert full == pytest.approx(2.0)  # the second half ran on tensor cores: healthy
        assert job_waste_usd(conn, job_id="nope", now=clock(), settings=Settings()) is None


def test_config_file_is_read_again_only_when_it_changes(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(
        "prices:\n  - {model_pattern: '*H100*', usd_per_gpu_hour: 2.0, effective_from: 2026-01-01}\n"
    )
    reads: list[Path] = []
    real_load = settings_module.load_config_file

    def counting_load(p: Path | None) -> dict[str, object]:
        assert p is not None
        reads.append(p)
        return real_load(p)

    monkeypatch.setattr(price_table, "load_config_file", counting_load)
    settings = Settings(config=path)
    with engine.connect() as conn:
        for _ in range(3):
            assert [
                r.usd_per_gpu_hour for r in price_table.effective_prices(conn, settings).rows
            ] == [2.0]
        assert len(reads) == 1
        path.write_text(
            "prices:\n  - {model_pattern: '*H100*', usd_per_gpu_hour: 2.75, effective_from: 2026-01-01}\n"
        )
        assert [r.usd_per_gpu_hour for r in price_table.effective_prices(conn, settings).rows] == [
            2.75
        ]
        assert len(reads) == 2
        path.unlink()
        with pytest.raises(ConfigError, match="does not exist"):
            price_table.effective_prices(conn, settings)
