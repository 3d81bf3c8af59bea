"""The fleet collector: registering it reads nothing; GpuFamily keeps its samples in rows."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from service.context import ServiceContext
from service.db.engine import make_engine
from service.exposition.families import GpuFamily
from service.settings import Settings
from service.usecases.metrics_endpoint import FleetCollector


def test_registering_the_collector_does_not_touch_the_database(tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path}/no/such/dir.db", run_scheduler=False)
    ctx = ServiceContext(settings=settings, engine=make_engine(settings.database_url))
    registry = CollectorRegistry(auto_describe=True)
    registry.register(FleetCollector(ctx))  # auto_describe would call collect() without describe()
    assert ctx.telemetry.db_errors.labels("metrics")._value.get() == 0.0


def test_gpu_family_samples_come_from_rows_only():
    sets = [{"uuid": "GPU-0"}, {"uuid": "GPU-1"}]
    fam = GpuFamily("demo_energy_joules", "Energy.", "counter", sets)
    fam.rows += [(1, 5.0), (0, 2.0)]
    assert [(s.name, s.labels, s.value) for s in fam.samples] == [
        ("demo_energy_joules_total", {"uuid": "GPU-1"}, 5.0),
        ("demo_energy_joules_total", {"uuid": "GPU-0"}, 2.0),
    ]
    with pytest.raises(TypeError):
        fam.samples = fam.samples
