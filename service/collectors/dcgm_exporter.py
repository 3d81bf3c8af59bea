"""The dcgm-exporter backend: scrape its /metrics and map DCGM_FI_* fields to canonical units.

``parse_exposition`` is pure (text in, devices, readings and job observations out); the backend
only adds the HTTP scrape through an injected httpx client. It reads what real exporters write
(tests/data/dcgm-exporter): ``Hostname`` or ``hostname``, ``UUID`` or ``uuid``, upper- or
lower-case field names, the pod labels ``pod``/``namespace`` or the older ``pod_name``/
``pod_namespace`` and ``pod_uid``, empty pod labels on unallocated GPUs, and DCGM's "blank" and
"not supported" sentinels (9223372036854775794 and friends), which are absent values.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import datetime

import httpx
from prometheus_client.parser import text_string_to_metric_families

from service.collectors.backend import (
    BackendError,
    Device,
    GpuReading,
    ProcessReading,
    Snapshot,
)
from service.collectors.mig import MigIdentities
from service.collectors.plausible import DCGM_SENTINELS
from service.vocabulary import DCGM_FIELDS, INT_METRICS, MIB, ActivitySource

RETIRED_LISTED_SCRAPES = 6  # more than the polls of one shipped batch
log = logging.getLogger(__name__)
_FB_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
_BY_NAME = {f.name: f for f in DCGM_FIELDS}


@dataclass
class Exposition:
    """What one scrape said: devices, one reading per device, jobs seen, and the hostname."""

    devices: list[Device] = field(default_factory=list)
    readings: list[GpuReading] = field(default_factory=list)
    jobs: list[ProcessReading] = field(default_factory=list)
    hostname: str | None = None
    # GPUs whose pods all carry the GPU's own value (time-slicing, --kubernetes-virtual-gpus):
    # the pods' activity cannot be told apart there.
    repeated: list[str] = field(default_factory=list)


# The activity rungs a pod's own series can carry, in ladder order.
_POD_RUNGS = ("sm_active", "gr_engine_active", "gpu_util")


def pod_shares(
    values: dict[str, dict[str, float]],
) -> tuple[dict[str, float] | None, bool]:
    """Each pod's activity on one GPU from its own series ({job: {metric: value}}), and whether
    every pod carries the same value (then None: dcgm-exporter repeated the GPU's value)."""
    for rung in _POD_RUNGS:
        got = {job: v[rung] for job, v in values.items() if rung in v}
        if len(got) == len(values) and got:
            if len(got) > 1 and max(got.values()) - min(got.values()) < 1e-9:
                return None, True
            return {job: min(max(v, 0.0), 1.0) for job, v in got.items()}, False
    return None, False


def _label(labels: dict[str, str], *names: str) -> str | None:
    for n in names:
        v = labels.get(n)
        if v:
            return v
    return None


def pod_job(labels: dict[str, str]) -> str | None:
    """``k8s:<namespace>/<pod>`` from dcgm-exporter's pod labels (new or old spelling).

    With only a pod UID (``pod_uid``) the id is ``k8s:<uid>``, as the cgroup path gives it.
    """
    pod = _label(labels, "pod", "pod_name")
    ns = _label(labels, "namespace", "pod_namespace")
    if pod is not None:
        return f"k8s:{ns}/{pod}" if ns else f"k8s:{pod}"
    uid = _label(labels, "pod_uid")
    return f"k8s:{uid}" if uid else None


def parse_exposition(text: str, mig: MigIdentities | None = None) -> Exposition:
    """Parse dcgm-exporter's text exposition into canonical devices and readings.

    MIG instances get their identity from ``mig`` (parent UUID, GPU_I_ID, GPU_I_PROFILE).
    """
    mig = mig or MigIdentities()
    per_gpu: dict[str, dict[str, float]] = {}
    fb: dict[str, dict[str, float]] = {}
    meta: dict[str, Device] = {}
    jobs: dict[tuple[str, str], ProcessReading] = {}
    pod_values: dict[str, dict[str, dict[str, float]]] = {}  # uuid -> job -> metric -> value
    profiling: set[str] = set()
    hostname: str | None = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            # The parser names counter samples <family>_total; dcgm-exporter's names have none.
            name = family.name if s.name == family.name + "_total" else s.name
            if name.startswith("dcgm_fi_"):  # some pipelines lower-case the names
                name = name.upper()
            labels = s.labels
            uuid = _label(labels, "UUID", "uuid")
            if uuid is None:
                continue
            gi = _label(labels, "GPU_I_ID")
            key = f"{uuid}/{gi}" if gi is not None else uuid
            if key not in meta:
                index = int(_label(labels, "gpu", "GPU") or 0)
                model = _label(labels, "modelName", "model_name") or "unknown"
                if gi is not None:
                    profile = (_label(labels, "GPU_I_PROFILE") or "unknown").lower()
                    meta[key] = Device(
                        mig.identity(uuid, gi, profile),
                        index,
                        f"{model} MIG {profile}",
                        mig_parent_uuid=uuid,
                    )
                else:
                    meta[key] = Device(uuid, index, model)
                meta[key].pci_bus_id = _label(labels, "pci_bus_id")
                meta[key].driver_version = _label(labels, "DCGM_FI_DRIVER_VERSION")
            hostname = hostname or _label(labels, "Hostname", "hostname")
            dev = meta[key]
            job = _label(labels, "hpc_job") or pod_job(labels)
            if job is not None and (dev.uuid, job) not in jobs:
                jobs[(dev.uuid, job)] = ProcessReading(
                    gpu_uuid=dev.uuid, pid=0, job_id=job, gpu_index=dev.index
                )
            # The parser hands integers back as int; DCGM's sentinels are compared as doubles.
            raw = float(s.value)
            if raw in DCGM_SENTINELS:  # blank, not supported, no permission
                continue  # the device and its pod are known; this value is absent
            if name in _FB_PARTS and math.isfinite(raw):
                fb.setdefault(dev.uuid, {})[name] = raw
            mapped = _BY_NAME.get(name)
            if mapped is None:
                continue
            canonical = mapped.metric
            value = raw * mapped.scale
            # NaN and infinities pass on as they are: the agent drops them, counts and logs them.
            if canonical in INT_METRICS and math.isfinite(value):
                value = float(int(value))
            if canonical == "xid_last" and value == 0:
                continue  # dcgm-exporter reports 0 for "no XID"; absent is the honest value
            per_gpu.setdefault(dev.uuid, {})[canonical] = value
            if job is not None and canonical in _POD_RUNGS:
                pod_values.setdefault(dev.uuid, {}).setdefault(job, {})[canonical] = value
            if name.startswith("DCGM_FI_PROF_"):
                profiling.add(dev.uuid)
    out = Exposition(hostname=hostname)
    for dev in meta.values():
        parts = fb.get(dev.uuid, {})
        if "DCGM_FI_DEV_FB_USED" in parts and "DCGM_FI_DEV_FB_FREE" in parts:
            dev.fb_total_bytes = int(sum(parts.values()) * MIB)
            per_gpu.setdefault(dev.uuid, {})["fb_total_bytes"] = float(dev.fb_total_bytes)
        out.devices.append(dev)
        metrics = per_gpu.get(dev.uuid)
        if metrics:
            source = ActivitySource.DCGM if dev.uuid in profiling else ActivitySource.NVML
            out.readings.append(GpuReading(dev.uuid, metrics, source))
    for uuid, by_job in pod_values.items():
        if len(by_job) < 2:
            continue  # one pod: the GPU's activity is its activity
        shares, repeated = pod_shares(by_job)
        if repeated:
            out.repeated.append(uuid)
        for job, share in (shares or {}).items():
            jobs[(uuid, job)].sm_util = share
        if shares:  # each pod's own share: the GPU did the sum of them
            rung = next(r for r in _POD_RUNGS if all(r in v for v in by_job.values()))
            per_gpu.setdefault(uuid, {})[rung] = min(sum(shares.values()), 1.0)
    out.jobs = list(jobs.values())
    return out


class DcgmExporterBackend:
    """Reads GPUs by scraping a dcgm-exporter /metrics URL each cycle."""

    name = "dcgm-exporter"

    def __init__(
        self,
        *,
        url: str,
        client: httpx.Client | None = None,
        timeout_seconds: float = 5.0,
        mig: MigIdentities | None = None,
        node: str | None = None,
    ) -> None:
        self.url = url
        self.node = node  # this agent's node, to notice an exporter of another node
        self._warned_node: str | None = None
        self.client = client or httpx.Client(timeout=timeout_seconds)
        self.mig = mig or MigIdentities()
        self._devices: list[Device] = []
        self._retired: dict[str, int] = {}  # identity -> scrapes it is still listed for
        self.hostname: str | None = None
        self._warned_repeated: set[str] = set()

    def _scrape(self) -> Exposition:
        try:
            r = self.client.get(self.url)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            raise BackendError(f"cannot scrape dcgm-exporter at {self.url}: {exc}") from exc
        try:
            return parse_exposition(r.text, self.mig)
        except ValueError as exc:
            raise BackendError(f"dcgm-exporter at {self.url} sent unparsable text: {exc}") from exc

    def devices(self) -> list[Device]:
        """The GPUs the last scrape listed (scrapes once if none yet)."""
        if not self._devices:
            self._devices = self._scrape().devices
        return self._devices

    def sample(self, now: datetime) -> Snapshot:
        """One scrape, stamped ``now``; GPUs that vanished from the exposition are flagged lost."""
        exp = self._scrape()
        seen = {d.uuid for d in exp.devices}
        # A parent is healthy while the exporter still lists it or any of its instances.
        parents = seen | {d.mig_parent_uuid for d in exp.devices if d.mig_parent_uuid}
        for old in self._devices:
            if old.uuid in seen:
                continue
            if old.retired or (old.mig_parent_uuid in parents and not old.lost):
                # Destroyed in a reconfiguration: retired, listed for a few scrapes so the
                # batch that carries it reaches central, then forgotten.
                if not old.retired:
                    old.retired = True
                    self.mig.retire(old.uuid)
                    self._retired[old.uuid] = RETIRED_LISTED_SCRAPES
                self._retired[old.uuid] -= 1
                if self._retired[old.uuid] > 0:
                    exp.devices.append(old)
                else:
                    del self._retired[old.uuid]
                continue
            old.lost = True
            exp.devices.append(old)
        self._devices = exp.devices
        self.hostname = exp.hostname
        self._check_node(exp.hostname)
        for uuid in exp.repeated:
            if uuid not in self._warned_repeated:
                self._warned_repeated.add(uuid)
                log.warning(
                    "dcgm-exporter gives every pod on GPU %s the GPU's own value (time-slicing, "
                    "--kubernetes-virtual-gpus): the pods' activity cannot be told apart, so "
                    "their busy time is split by the cost split rule's fallback",
                    uuid,
                )
        return Snapshot(ts=now, readings=exp.readings, processes=exp.jobs)

    def _check_node(self, hostname: str | None) -> None:
        """Warn (once per name) when the exporter names another node than this agent's.

        With NODE_NAME set (the GPU Operator sets it) dcgm-exporter's Hostname is the node; a
        different one means the agent reads another node's exporter, typically through a Service
        without ``internalTrafficPolicy: Local``. Exporters without NODE_NAME report their pod's
        name, which says nothing, so this only warns.
        """
        if self.node is None or hostname is None or "dcgm-exporter" in hostname:
            return
        if hostname.split(".")[0] == self.node.split(".")[0] or hostname == self._warned_node:
            return
        self._warned_node = hostname
        log.warning(
            "dcgm-exporter at %s reports node %r, but this agent is node %r: it may be reading "
            "another node's GPUs (give the exporter's Service internalTrafficPolicy: Local)",
            self.url,
            hostname,
            self.node,
        )

    def close(self) -> None:
        """Keep the client: it is reused after a failure."""
