"""Prometheus families in a registry of their owner's own (nothing global), shared by the
central service's and the agent's telemetry; labelled series may start at 0.

A series that first appears at 1 has no earlier sample to rise from, so increase() - and every
rule built on it - would miss the first event; one that exists at 0 from the start shows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class OwnRegistry:
    """A registry of this object's own, and the families its subclass declares into it."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)

    def counter(
        self, name: str, documentation: str, labels: Sequence[str] = (), *, zero: Iterable[str] = ()
    ) -> Counter:
        """A counter in this registry, with a series at 0 for each one-label value in ``zero``."""
        family = Counter(name, documentation, labels, registry=self.registry)
        for value in zero:
            family.labels(value)
        return family

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        """A gauge in this registry."""
        return Gauge(name, documentation, labels, registry=self.registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
    ) -> Histogram:
        """A histogram in this registry."""
        return Histogram(name, documentation, labels, registry=self.registry, buckets=buckets)
