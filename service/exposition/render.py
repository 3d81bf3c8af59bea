"""Rendering a registry for /metrics: content negotiation and no ``_created`` series."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

_CREATED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


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


def render(registry: Collector, accept: str | None) -> tuple[bytes, str]:
    """The exposition body and its content type, in the format ``accept`` asks for."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(WithoutCreated(registry)), content_type
