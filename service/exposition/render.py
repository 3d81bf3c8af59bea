"""Rendering /metrics: the Prometheus text format, without ``_created`` series, fast.

``encode_text`` produces exactly what prometheus_client's ``generate_latest`` produces (a test
holds the two byte-equal) through the library's own escaping functions; it only formats each
distinct label set once instead of once per sample. Every GPU has one label set shared by its
twenty-odd series, so that is most of the work of a 1,000-GPU scrape.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics import exposition as om
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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
            if fam.type not in _CREATED_TYPES:
                yield fam
                continue
            created = fam.name + "_created"
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            out.samples = [s for s in fam.samples if s.name != created]
            yield out


def encode_text(collector: Collector) -> bytes:
    """The Prometheus text format (0.0.4) of ``collector``, byte-equal to generate_latest's."""
    # id(labels) -> (labels, "{...}"); holding the dict keeps its id from being reused.
    label_strings: dict[int, tuple[dict[str, str], str]] = {}
    names: dict[str, str] = {}

    def name_of(name: str) -> str:
        escaped = names.get(name)
        if escaped is None:
            escaped = names[name] = om.escape_metric_name(name, om.UNDERSCORES)
        return escaped

    def labels_of(labels: dict[str, str]) -> str:
        if not labels:
            return ""
        hit = label_strings.get(id(labels))
        if hit is not None and hit[0] is labels:
            return hit[1]
        text = ",".join(
            f'{om.escape_label_name(k, om.UNDERSCORES)}="{om._escape(v, om.ALLOWUTF8, False)}"'  # type: ignore[arg-type]
            for k, v in sorted(labels.items())
        )
        text = "{" + text + "}"
        label_strings[id(labels)] = (labels, text)
        return text

    def doc_of(metric: Metric) -> str:
        return metric.documentation.replace("\\", r"\\").replace("\n", r"\n")

    floats: dict[float, str] = {}

    def float_of(value: float) -> str:
        # Values repeat a lot across a fleet (0, 1, fb_total, prices, a node's timestamp).
        text = floats.get(value)
        if text is None:
            text = floatToGoString(value)  # type: ignore[no-untyped-call]
            if value != 0:  # 0.0 == -0.0 share a key but not a text
                floats[value] = text
        return text

    out: list[str] = []
    append = out.append
    for metric in collector.collect():
        mname, mtype = metric.name, metric.type
        if mtype == "counter":
            mname += "_total"
        elif mtype == "info":
            mname += "_info"
        mtype = _TYPE_IN_TEXT.get(mtype, mtype)
        append(f"# HELP {name_of(mname)} {doc_of(metric)}\n")
        append(f"# TYPE {name_of(mname)} {mtype}\n")
        om_names = {metric.name + suffix: suffix for suffix in _OM_ONLY}
        om_lines: dict[str, list[str]] = {}
        for s in metric.samples:
            ts = "" if s.timestamp is None else f" {int(float(s.timestamp) * 1000):d}"
            hit = label_strings.get(id(s.labels))
            labels = hit[1] if hit is not None and hit[0] is s.labels else labels_of(s.labels)
            name = names.get(s.name) or name_of(s.name)
            line = f"{name}{labels} {float_of(s.value)}{ts}\n"
            suffix = om_names.get(s.name)
            if suffix is None:
                append(line)
            else:
                om_lines.setdefault(suffix, []).append(line)
        for suffix, lines in sorted(om_lines.items()):
            append(f"# HELP {name_of(metric.name + suffix)} {doc_of(metric)}\n")
            append(f"# TYPE {name_of(metric.name + suffix)} gauge\n")
            out.extend(lines)
    return "".join(out).encode("utf-8")


def render(registry: Collector) -> tuple[bytes, str]:
    """The exposition body and its content type.

    Always the text format: Prometheus accepts it alongside OpenMetrics, and OpenMetrics would
    add nothing here (no exemplars, and _created series are dropped on purpose).
    """
    return encode_text(WithoutCreated(registry)), CONTENT_TYPE_PLAIN_0_0_4
