"""dcgm-exporter compatible families (names, labels and units as NVIDIA's exporter writes them).

Pure. With GPUWARDEN_METRICS_DCGM_COMPAT=true these sit beside the gpuwarden_* families so
dashboards written for dcgm-exporter (NVIDIA's Grafana dashboard 12239 among them) work unchanged.
Labels as dcgm-exporter writes them: gpu, UUID, device, modelName, Hostname, pci_bus_id,
DCGM_FI_DRIVER_VERSION, pod and namespace (Kubernetes jobs) and GPU_I_ID / GPU_I_PROFILE (MIG,
whose UUID is the parent's, as in dcgm-exporter).

One central service scrapes as one target, so every node would collapse into one ``instance`` and
``gpu="0"`` would exist once per node. Each series therefore carries ``instance`` = its node, the
identity a per-node dcgm-exporter target would have; the shipped scrape config
(deploy/prometheus/dcgm-compat-scrape.yml) keeps it with ``honor_labels: true``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from prometheus_client.core import Metric

from service.exposition.families import GpuFamily
from service.exposition.types import FleetGpu
from service.vocabulary import DCGM_FIELDS, MIB

# GPU Warden's MIG identity (service/collectors/mig.py): MIG-<parent>/<gi>/<profile>@<created>.
_MIG_ID = re.compile(r"^MIG-(?P<parent>.+)/(?P<gi>\d+)/(?P<profile>[^/@]+)@[0-9TZ]+$")


def dcgm_labels(r: FleetGpu) -> dict[str, str]:
    """The labels dcgm-exporter would put on this GPU's series, plus its node as ``instance``."""
    labels = {
        "gpu": str(r.index),
        "UUID": r.uuid,
        "device": f"nvidia{r.index}",
        "modelName": r.model,
        "Hostname": r.node,
        "instance": r.node,
    }
    mig = _MIG_ID.match(r.uuid)
    if mig is not None:
        labels["UUID"] = mig["parent"]
        labels["modelName"] = r.model.split(" MIG ", 1)[0]
        labels["GPU_I_PROFILE"] = mig["profile"]
        labels["GPU_I_ID"] = mig["gi"]
    if r.pci_bus_id:
        labels["pci_bus_id"] = r.pci_bus_id
    if r.driver_version:
        labels["DCGM_FI_DRIVER_VERSION"] = r.driver_version
    if r.job_id and r.job_id.startswith("k8s:") and "/" in r.job_id:
        namespace, pod = r.job_id[4:].split("/", 1)
        labels["namespace"], labels["pod"] = namespace, pod
    return labels


def dcgm_families(readings: Sequence[FleetGpu]) -> list[Metric]:
    """One family per dcgm-exporter field over ``readings``, typed as dcgm-exporter types it.

    Counters (TOTAL_ENERGY_CONSUMPTION, PCIE_REPLAY_COUNTER, UNCORRECTABLE_REMAPPED_ROWS) keep
    dcgm-exporter's sample names, without ``_total``, as its own output has them.
    """
    label_sets: list[dict[str, str]] = []
    fams = [
        (f, GpuFamily(f.name, f.help, f.prom_type, label_sets, sample_name=f.name))
        for f in DCGM_FIELDS
    ]
    reserved = GpuFamily(
        "DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", "gauge", label_sets
    )
    slots = [(f.metric, 1.0 / f.scale, fam.rows) for f, fam in fams]
    for i, r in enumerate(readings):
        label_sets.append(dcgm_labels(r))
        values = r.values
        for metric, factor, rows in slots:
            v = values.get(metric)
            if v is not None:
                rows.append((i, v * factor))
        # What the driver keeps for itself, where the three figures that tell it are reported
        # (DCGM: total = used + free + reserved), so a reader gets the total back.
        total = values.get("fb_total_bytes", r.fb_total_bytes)
        used, free = values.get("fb_used_bytes"), values.get("fb_free_bytes")
        if total is not None and used is not None and free is not None:
            reserved.rows.append((i, max(total - used - free, 0) / MIB))
    return [*(fam for _, fam in fams), reserved]
