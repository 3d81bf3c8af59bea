"""Rendering /metrics: the Prometheus text format, without ``_created`` series, fast.

``encode_text`` produces exactly what prometheus_client's ``generate_latest`` produces (a test
holds the two byte-equal) with the library's own escaping rules; it formats each distinct label
set once instead of once per sample, and numbers in bulk. Every GPU has one label set shared by
its twenty-odd series, so that is most of the work of a 1,000-GPU scrape.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics import exposition as om
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from service.exposition.families import GpuFamily

_CREATED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})
_TYPE_IN_TEXT = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}
_TYPE_IN_TEXT["unknown"] = "untyped"
_OM_ONLY = ("_created", "_gsum", "_gcount")


class WithoutCreated(Collector):
    """A view of a collector that drops the ``<name>_created`` samples of its families.

    prometheus_client's own switch (disable_created_metrics) is process-global; this view keeps
    the choice to the one registry /metrics renders.
    """

    def __init__(self, inner: Collector) -> None:
        self._inner = inner

    def collect(self) -> Iterable[Metric]:
        """The inner families, minus their ``_created`` samples."""
        for fam in self._inner.collect():
            if fam.type not in _CREATED_TYPES or isinstance(fam, GpuFamily):
                yield fam  # a GpuFamily never holds _created samples
                continue
            created = fam.name + "_created"
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            out.samples = [s for s in fam.samples if s.name != created]
            yield out


class Joined(Collector):
    """Several collectors rendered as one, in order."""

    def __init__(self, *parts: Collector) -> None:
        self._parts = parts

    def collect(self) -> Iterable[Metric]:
        """Every part's families, part by part."""
        for part in self._parts:
            yield from part.collect()


_GO_EXPONENT_FROM = 1e6  # from here floatToGoString rewrites Python's repr (see go_floats)
_PYTHON_EXPONENT_FROM = 1e16  # from here repr itself writes an exponent
_MINUS_INF = float("-inf")


def go_floats(values: list[float]) -> list[str]:
    """floatToGoString of every value, byte for byte, with the common work done in C.

    floatToGoString returns repr(float(v)), except 'NaN', '+Inf' and '-Inf', and for positive
    values in [1e6, 1e16) where Go writes an exponent sooner than Python: '2.147483648e+10' for
    21474836480.0. Byte sizes, energy and timestamps are such values, so that rewrite is done
    here the way floatToGoString does it; the rare NaN and infinities go through it.
    """
    floats = list(map(float, values))
    texts = list(map(repr, floats))
    flagged = [
        j for j, d in enumerate(floats) if d >= _GO_EXPONENT_FROM or d != d or d == _MINUS_INF
    ]
    for j in flagged:
        d = floats[j]
        if _GO_EXPONENT_FROM <= d < _PYTHON_EXPONENT_FROM:
            s = texts[j]
            dot = s.find(".")
            mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
            texts[j] = f"{mantissa}e+{dot - 1:02d}"
        else:
            texts[j] = floatToGoString(d)  # type: ignore[no-untyped-call]
    return texts


def encode_text(collector: Collector) -> bytes:
    """The Prometheus text format (0.0.4) of ``collector``, byte-equal to generate_latest's.

    A labels dict is formatted once and its text reused for every sample holding that same
    dict object (collectors must not mutate a labels dict while it is being rendered).
    """
    encoder = _TextEncoder()
    for metric in collector.collect():
        encoder.family(metric)
    return "".join(encoder.out).encode("utf-8")


class _TextEncoder:
    """One encode_text call: its output lines and what it has formatted so far, to reuse."""

    def __init__(self) -> None:
        # id(labels) -> "{...}". `keep` holds every formatted dict, so no id is reused in this call.
        self.label_texts: dict[int, str] = {}
        self.keep: list[object] = []
        self.label_names: dict[str, str] = {}
        self.names: dict[str, str] = {}
        self.floats: dict[float, str] = {}
        self.set_texts: dict[int, list[str]] = {}  # id(GpuFamily.label_sets) -> each set's text
        self.out: list[str] = []

    def family(self, metric: Metric) -> None:
        """Append ``metric``'s HELP and TYPE lines and its samples."""
        mname, mtype = metric.name, metric.type
        if mtype == "counter":
            # A GpuFamily counter may keep a name without _total (dcgm-exporter's counters do):
            # its TYPE line names the samples it types.
            mname = metric.sample_name if isinstance(metric, GpuFamily) else mname + "_total"
        elif mtype == "info":
            mname += "_info"
        mtype = _TYPE_IN_TEXT.get(mtype, mtype)
        self.out.append(f"# HELP {self.name_of(mname)} {_doc_of(metric)}\n")
        self.out.append(f"# TYPE {self.name_of(mname)} {mtype}\n")
        if isinstance(metric, GpuFamily):
            self.gpu_family_samples(metric)
        else:
            self.samples(metric)

    def gpu_family_samples(self, metric: GpuFamily) -> None:
        """Append a GpuFamily's rows, each label set formatted once per call."""
        texts = self.set_texts.get(id(metric.label_sets))
        if texts is None:
            texts = self.set_texts[id(metric.label_sets)] = self.label_set_texts(metric.label_sets)
            self.keep.append(metric.label_sets)
        sname = self.name_of(metric.sample_name)
        numbers = go_floats([v for _, v in metric.rows])
        self.out += [
            f"{sname}{texts[i]} {n}\n" for (i, _), n in zip(metric.rows, numbers, strict=True)
        ]

    def samples(self, metric: Metric) -> None:
        """Append an ordinary family's samples; OpenMetrics-only ones as gauges of their own."""
        samples = metric.samples
        om_names = {metric.name + suffix: suffix for suffix in _OM_ONLY}
        lab, flo, nam = self.label_texts.get, self.floats.get, self.names.get
        name_of, labels_of, float_of = self.name_of, self.labels_of, self.float_of
        # Sample is a tuple (name, labels, value, timestamp, ...); indexing it is the fast path.
        if all(s[3] is None and s[0] not in om_names for s in samples):
            self.out += [
                f"{nam(s[0]) or name_of(s[0])}{lab(id(s[1])) or labels_of(s[1])}"
                f" {flo(s[2]) or float_of(s[2])}\n"
                for s in samples
            ]
            return
        self.stamped_samples(metric, om_names)

    def stamped_samples(self, metric: Metric, om_names: dict[str, str]) -> None:
        """Append samples with timestamps (in ms) or OpenMetrics-only names, the slow way."""
        lab = self.label_texts.get
        name_of, labels_of, float_of = self.name_of, self.labels_of, self.float_of
        om_lines: dict[str, list[str]] = {}
        for s in metric.samples:
            stamp = "" if s[3] is None else f" {int(float(s[3]) * 1000):d}"
            line = f"{name_of(s[0])}{lab(id(s[1])) or labels_of(s[1])} {float_of(s[2])}{stamp}\n"
            suffix = om_names.get(s[0])
            if suffix is None:
                self.out.append(line)
            else:
                om_lines.setdefault(suffix, []).append(line)
        for suffix, lines in sorted(om_lines.items()):
            self.out.append(f"# HELP {name_of(metric.name + suffix)} {_doc_of(metric)}\n")
            self.out.append(f"# TYPE {name_of(metric.name + suffix)} gauge\n")
            self.out += lines

    def name_of(self, name: str) -> str:
        """A metric name, escaped."""
        escaped = self.names.get(name)
        if escaped is None:
            escaped = self.names[name] = om.escape_metric_name(name, om.UNDERSCORES)
        return escaped

    def label_name_of(self, name: str) -> str:
        """A label name, escaped."""
        escaped = self.label_names.get(name)
        if escaped is None:
            escaped = self.label_names[name] = om.escape_label_name(name, om.UNDERSCORES)
        return escaped

    def labels_of(self, labels: dict[str, str]) -> str:
        """A labels dict as "{...}" ("" when empty), kept for its next sample."""
        if not labels:
            return ""
        text = ",".join(
            f'{self.label_name_of(k)}="{om._escape(v, om.ALLOWUTF8, False)}"'  # type: ignore[arg-type]
            for k, v in sorted(labels.items())
        )
        text = self.label_texts[id(labels)] = "{" + text + "}"
        self.keep.append(labels)
        return text

    def label_set_texts(self, sets: list[dict[str, str]]) -> list[str]:
        """Each label set of a GpuFamily as "{...}"."""
        # The sets of one GpuFamily share their keys: sort and escape the names once, and
        # escape each set's values in one pass (om._escape's three replaces, in its order).
        if not sets or not sets[0]:
            return [self.labels_of(d) for d in sets]
        keys = tuple(sets[0])
        order = sorted(keys)
        names = ",".join(f'{self.label_name_of(k)}="{{}}"' for k in order)
        template = "{{" + names + "}}"
        n_separators = len(order) - 1
        out = []
        for d in sets:
            joined = "\x00".join([d[k] for k in order]) if tuple(d) == keys else None
            if joined is None or joined.count("\x00") != n_separators:  # NUL inside a value
                out.append(self.labels_of(d))
                continue
            escaped = joined.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
            out.append(template.format(*escaped.split("\x00")))
        return out

    def float_of(self, value: float) -> str:
        """A sample value as floatToGoString writes it, kept for its next use."""
        text = go_floats([value])[0]
        if value != 0:  # 0.0 and -0.0 would share a key but not a text
            self.floats[value] = text  # values repeat across a fleet: 0/1 flags, prices, totals
        return text


def _doc_of(metric: Metric) -> str:
    return metric.documentation.replace("\\", r"\\").replace("\n", r"\n")


def render(registry: Collector) -> tuple[bytes, str]:
    """The exposition body and its content type.

    Always the text format: Prometheus accepts it alongside OpenMetrics, and OpenMetrics would
    add nothing here (no exemplars, and _created series are dropped on purpose).
    """
    return encode_text(WithoutCreated(registry)), CONTENT_TYPE_PLAIN_0_0_4
