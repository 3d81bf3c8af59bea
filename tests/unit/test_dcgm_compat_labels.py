"""The compat exposition's labels: dcgm-exporter's spellings, MIG, pods, and a node instance."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from service.collectors.dcgm_exporter import parse_exposition
from service.collectors.mig import MigIdentities
from service.exposition.dcgm import dcgm_families, dcgm_labels
from service.exposition.types import GpuReading

NOW = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
PARENT = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
IDENTITY = f"MIG-{PARENT}/7/1g.10gb@20261203T080000Z"


def mig_reading() -> GpuReading:
    return GpuReading(
        node="gsrh100-074",
        index=0,
        uuid=IDENTITY,
        model="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        last_sample_at=NOW,
        values={"gr_engine_active": 0.25},
        mig_parent_uuid=PARENT,
        pci_bus_id="00000000:1A:00.0",
        driver_version="535.129.03",
        job_id="k8s:model-playground-stg/tts-predictor-0",
    )


def test_mig_instance_labels_follow_dcgm_exporter():
    assert dcgm_labels(mig_reading()) == {
        "gpu": "0",
        "UUID": PARENT,
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "gsrh100-074",
        "instance": "gsrh100-074",
        "GPU_I_PROFILE": "1g.10gb",
        "GPU_I_ID": "7",
        "pci_bus_id": "00000000:1A:00.0",
        "DCGM_FI_DRIVER_VERSION": "535.129.03",
        "namespace": "model-playground-stg",
        "pod": "tts-predictor-0",
    }


def test_what_compat_writes_the_dcgm_exporter_backend_reads_back_as_the_same_instance():
    from prometheus_client import CollectorRegistry, generate_latest

    class Fams:
        def collect(self) -> list[Any]:
            return dcgm_families([mig_reading()])

    reg = CollectorRegistry()
    reg.register(Fams())
    text = generate_latest(reg).decode()
    ids = MigIdentities(clock=lambda: NOW)
    exp = parse_exposition(text, ids)
    (dev,) = exp.devices
    assert dev.uuid == IDENTITY and dev.mig_parent_uuid == PARENT
    assert dev.pci_bus_id == "00000000:1A:00.0" and dev.driver_version == "535.129.03"
    assert [p.job_id for p in exp.jobs] == ["k8s:model-playground-stg/tts-predictor-0"]
    assert exp.readings[0].metrics["gr_engine_active"] == 0.25
