"""dcgm-exporter compatible families (names, labels and units as NVIDIA's exporter writes them).

Pure. With GPUWARDEN_METRICS_DCGM_COMPAT=true these sit beside the gpuwarden_* families so
dashboards written for dcgm-exporter (NVIDIA's Grafana dashboard 12239 among them) work unchanged.
dcgm-exporter's labels are gpu, UUID, device, modelName and Hostname (plus pci_bus_id and
DCGM_FI_DRIVER_VERSION, which the wire format does not carry, and pod labels on Kubernetes).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import Metric

from service.exposition.families import GpuFamily
from service.exposition.types import GpuReading
from service.vocabulary import DCGM_FIELDS, MIB


def dcgm_families(readings: Sequence[GpuReading]) -> list[Metric]:
    """One gauge family per dcgm-exporter field, plus DCGM_FI_DEV_FB_FREE, over ``readings``.

    TOTAL_ENERGY_CONSUMPTION is a counter in dcgm-exporter, but its name has no ``_total``;
    it is exposed as a gauge so the name stays exactly the same (rate() works on either).
    """
    label_sets: list[dict[str, str]] = []
    fams = [(f, GpuFamily(f.name, f.help, "gauge", label_sets)) for f in DCGM_FIELDS]
    fb_free = GpuFamily(
        "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge", label_sets
    )
    slots = [(f.metric, 1.0 / f.scale, fam.rows) for f, fam in fams]
    for i, r in enumerate(readings):
        label_sets.append(
            {
                "gpu": str(r.index),
                "UUID": r.uuid,
                "device": f"nvidia{r.index}",
                "modelName": r.model,
                "Hostname": r.node,
            }
        )
        values = r.values
        for metric, factor, rows in slots:
            v = values.get(metric)
            if v is not None:
                rows.append((i, v * factor))
        total = values.get("fb_total_bytes", r.fb_total_bytes)
        used = values.get("fb_used_bytes")
        if total is not None and used is not None:
            fb_free.rows.append((i, max(total - used, 0) / MIB))
    out: list[Metric] = [fam for _, fam in fams]
    out.append(fb_free)
    return out
