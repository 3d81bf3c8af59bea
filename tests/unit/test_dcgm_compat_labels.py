"""The compat exposition's labels: dcgm-exporter's spellings, MIG, pods, and a node instance."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from service.collectors.dcgm_exporter import parse_exposition
from service.collectors.mig import MigIdentities
from service.exposition.dcgm import dcgm_families, dcgm_labels
from service.exposition.types import FleetGpu

NOW = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
PARENT = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
IDENTITY = f"MIG-{PARENT}/7/1g.10gb@20261203T080000Z"


def mig_reading() -> FleetGpu:
    return FleetGpu(
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


def compat_text(r: FleetGpu) -> str:
    """What /metrics renders of ``r``'s compat families."""
    from prometheus_client import CollectorRegistry

    from service.exposition.render import render

    class Fams:
        def collect(self) -> list[Any]:
            return dcgm_families([r])

    reg = CollectorRegistry()
    reg.register(Fams())
    return render(reg)[0].decode()


def test_compat_types_and_names_are_dcgm_exporters():
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    from tests.unit.dcgm_support import NVIDIA_DEFAULT, enabled

    values = {
        "energy_joules": 10.0,
        "pcie_replays": 3.0,
        "remapped_rows_uncorrectable": 1.0,
        "gpu_util": 0.5,
    }
    text = compat_text(FleetGpu("n", 0, "GPU-1", "NVIDIA H100", NOW, values=values))
    # The TYPE dcgm-exporter gives each field is the one its default counters file names.
    stock = enabled(NVIDIA_DEFAULT)
    typed = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name, kind in typed.items():
        if name in stock:
            assert kind == stock[name], name
    assert typed["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    # ... under the same sample names, no _total added (dcgm-exporter adds none).
    capture = Path(NVIDIA_DEFAULT).parent / "v100-default-counters.prom"
    assert "\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER{" in capture.read_text()
    assert "\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER{" in text
    assert "_total" not in text


def test_compat_fb_free_is_the_free_memory_reserved_memory_excluded():
    # 80 GiB in all, 2 GiB used, 1 GiB reserved by the driver: 77 GiB free, as DCGM's own
    # DCGM_FI_DEV_FB_FREE says (total - used would count the reserved GiB as free).
    mib = 1024 * 1024
    values = {
        "fb_used_bytes": 2048.0 * mib,
        "fb_total_bytes": 81920.0 * mib,
        "fb_free_bytes": 78848.0 * mib,
    }
    r = FleetGpu("n", 0, "GPU-1", "NVIDIA H100", NOW, values=values)
    (dev_free,) = [
        line for line in compat_text(r).splitlines() if line.startswith("DCGM_FI_DEV_FB_FREE{")
    ]
    assert float(dev_free.rsplit(" ", 1)[1]) == 78848.0
    # Read back by the dcgm-exporter backend: the same free figure.
    (back,) = parse_exposition(compat_text(r)).readings
    assert back.metrics["fb_free_bytes"] == 78848.0 * mib
    # Without a free figure, none is made up from total - used.
    del values["fb_free_bytes"]
    assert "DCGM_FI_DEV_FB_FREE{" not in compat_text(r)
