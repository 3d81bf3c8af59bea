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

from service.collectors.backend import (
    BackendError,
    Device,
    GpuReading,
    ProcessReading,
    Snapshot,
)
from service.collectors.exposition_lines import Lines, read_lines
from service.collectors.mig import MigIdentities
from service.collectors.plausible import DCGM_SENTINELS
from service.vocabulary import DCGM_FIELD_ALIASES, DCGM_FIELDS, INT_METRICS, MIB, ActivitySource

RETIRED_LISTED_SCRAPES = 6  # more than the polls of one shipped batch
log = logging.getLogger(__name__)
_FB_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
_BY_NAME = {f.name: f for f in DCGM_FIELDS}
_BY_NAME |= {old: _BY_NAME[new] for old, new in DCGM_FIELD_ALIASES.items()}


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


def _sample_name(family_name: str, sample_name: str) -> str:
    """The DCGM field name of one sample, in upper case as dcgm-exporter writes it."""
    # The parser names counter samples <family>_total; dcgm-exporter's names have none.
    name = family_name if sample_name == family_name + "_total" else sample_name
    if name.startswith("dcgm_fi_"):  # some pipelines lower-case the names
        name = name.upper()
    return name


def _device(labels: dict[str, str], uuid: str, gi: str | None, mig: MigIdentities) -> Device:
    """The device one sample's labels name: a whole GPU, or MIG instance ``gi`` of it."""
    index = int(_label(labels, "gpu", "GPU") or 0)
    model = _label(labels, "modelName", "model_name") or "unknown"
    if gi is not None:
        profile = (_label(labels, "GPU_I_PROFILE") or "unknown").lower()
        dev = Device(
            mig.identity(uuid, gi, profile),
            index,
            f"{model} MIG {profile}",
            mig_parent_uuid=uuid,
        )
    else:
        dev = Device(uuid, index, model)
    dev.pci_bus_id = _label(labels, "pci_bus_id")
    dev.driver_version = _label(labels, "DCGM_FI_DRIVER_VERSION")
    return dev


@dataclass
class _ParseState:
    """What the samples of one exposition said so far, keyed by device identity."""

    mig: MigIdentities
    per_gpu: dict[str, dict[str, float]] = field(default_factory=dict)
    fb: dict[str, dict[str, float]] = field(default_factory=dict)  # uuid -> field -> MiB
    meta: dict[str, Device] = field(default_factory=dict)  # uuid or uuid/GPU_I_ID -> device
    jobs: dict[tuple[str, str], ProcessReading] = field(default_factory=dict)
    # uuid -> job -> metric -> value
    pod_values: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    profiling: set[str] = field(default_factory=set)
    hostname: str | None = None

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        """Take one sample: its device, its pod and, unless a DCGM sentinel, its value."""
        where = self._where(labels)
        if where is None:
            return
        # The parser hands integers back as int; DCGM's sentinels are compared as doubles.
        raw = float(value)
        if raw in DCGM_SENTINELS:  # blank, not supported, no permission
            return  # the device and its pod are known; this value is absent
        self._value(name, where[0], where[1], raw)

    def _where(self, labels: dict[str, str]) -> tuple[str, str | None] | None:
        """The device (made known on first sight) and job a sample's labels name, if any."""
        uuid = _label(labels, "UUID", "uuid")
        if uuid is None:
            return None
        gi = _label(labels, "GPU_I_ID")
        key = f"{uuid}/{gi}" if gi is not None else uuid
        dev = self.meta.get(key)
        if dev is None:
            dev = self.meta[key] = _device(labels, uuid, gi, self.mig)
        self.hostname = self.hostname or _label(labels, "Hostname", "hostname")
        job = _label(labels, "hpc_job") or pod_job(labels)
        if job is not None and (dev.uuid, job) not in self.jobs:
            self.jobs[(dev.uuid, job)] = ProcessReading(
                gpu_uuid=dev.uuid, pid=0, job_id=job, gpu_index=dev.index
            )
        return dev.uuid, job

    def add_lines(self, lines: Lines) -> None:
        """Take every sample ``read_lines`` read: each label set's device and job found once
        (a sample of a label set seen before makes nothing new known), then the values."""
        where: dict[str, tuple[str, str | None] | None] = {}
        sentinels = DCGM_SENTINELS
        for name, key, raw in lines.samples:
            if key in where:
                found = where[key]
            else:
                found = where[key] = self._where(lines.labels[key])
            if found is not None and raw not in sentinels:
                self._value(name, found[0], found[1], raw)

    def _value(self, name: str, uuid: str, job: str | None, raw: float) -> None:
        """Record field ``name``'s raw value on device ``uuid`` in canonical units."""
        if name in _FB_PARTS and math.isfinite(raw):
            self.fb.setdefault(uuid, {})[name] = raw
        mapped = _BY_NAME.get(name)
        if mapped is None:
            return
        canonical = mapped.metric
        value = raw * mapped.scale
        # NaN and infinities pass on as they are: the agent drops them, counts and logs them.
        if canonical in INT_METRICS and math.isfinite(value):
            value = float(int(value))
        if canonical == "xid_last" and value == 0:
            return  # dcgm-exporter reports 0 for "no XID"; absent is the honest value
        self.per_gpu.setdefault(uuid, {})[canonical] = value
        if job is not None and canonical in _POD_RUNGS:
            self.pod_values.setdefault(uuid, {}).setdefault(job, {})[canonical] = value
        if name.startswith("DCGM_FI_PROF_"):
            self.profiling.add(uuid)

    def exposition(self) -> Exposition:
        """The devices, readings and jobs of every sample taken."""
        out = Exposition(hostname=self.hostname)
        for dev in self.meta.values():
            parts = self.fb.get(dev.uuid, {})
            if "DCGM_FI_DEV_FB_USED" in parts and "DCGM_FI_DEV_FB_FREE" in parts:
                dev.fb_total_bytes = int(sum(parts.values()) * MIB)
                self.per_gpu.setdefault(dev.uuid, {})["fb_total_bytes"] = float(dev.fb_total_bytes)
            out.devices.append(dev)
            metrics = self.per_gpu.get(dev.uuid)
            if metrics:
                source = ActivitySource.DCGM if dev.uuid in self.profiling else ActivitySource.NVML
                out.readings.append(GpuReading(dev.uuid, metrics, source))
        for uuid, by_job in self.pod_values.items():
            if len(by_job) > 1:  # one pod: the GPU's activity is its activity
                self._share_pods(uuid, by_job, out)
        out.jobs = list(self.jobs.values())
        return out

    def _share_pods(self, uuid: str, by_job: dict[str, dict[str, float]], out: Exposition) -> None:
        """Give each of several pods on GPU ``uuid`` its own activity share (a 0..1 ratio)."""
        shares, repeated = pod_shares(by_job)
        if repeated:
            out.repeated.append(uuid)
        for job, share in (shares or {}).items():
            self.jobs[(uuid, job)].sm_util = share
        if shares:  # each pod's own share: the GPU did the sum of them
            rung = next(r for r in _POD_RUNGS if all(r in v for v in by_job.values()))
            # The reading holds this same dict, so the sum reaches it.
            self.per_gpu.setdefault(uuid, {})[rung] = min(sum(shares.values()), 1.0)


def parse_exposition(text: str, mig: MigIdentities | None = None) -> Exposition:
    """Parse dcgm-exporter's text exposition into canonical devices and readings.

    MIG instances get their identity from ``mig`` (parent UUID, GPU_I_ID, GPU_I_PROFILE).
    """
    state = _ParseState(mig or MigIdentities())
    lines = read_lines(text)
    if lines is not None:
        state.add_lines(lines)
        return state.exposition()
    return parse_with_prometheus_client(text, state.mig)


def parse_with_prometheus_client(text: str, mig: MigIdentities | None = None) -> Exposition:
    """``parse_exposition`` by prometheus_client's parser: for text outside the plain form
    ``read_lines`` reads (and the reference it is compared with)."""
    from prometheus_client.parser import text_string_to_metric_families

    state = _ParseState(mig or MigIdentities())
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            state.add(_sample_name(family.name, s.name), s.labels, s.value)
    return state.exposition()


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
