"""A metric family for per-GPU series: one shared list of label sets, (index, value) rows.

Every GPU's twenty-odd series carry the same labels. Holding the label sets once and the
samples as (label-set index, value) rows keeps building a 1,000-GPU scrape cheap, and lets
the encoder format each GPU's labels once. ``samples`` still gives ordinary prometheus_client
Samples to anything that asks (generate_latest, tests).
"""

from __future__ import annotations

from prometheus_client.core import Metric
from prometheus_client.samples import Sample


class GpuFamily(Metric):
    """A gauge or counter family whose samples share ``label_sets`` by index."""

    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str,
        label_sets: list[dict[str, str]],
        *,
        sample_name: str | None = None,
    ) -> None:
        super().__init__(name, documentation, typ)
        if sample_name is None:
            sample_name = name + "_total" if typ == "counter" else name
        self.sample_name = sample_name
        self.label_sets = label_sets  # shared by every GpuFamily of one scrape
        self.rows: list[tuple[int, float]] = []

    @property
    def samples(self) -> list[Sample]:
        """The rows as prometheus_client Samples."""
        sets, name = self.label_sets, self.sample_name
        return [Sample(name, sets[i], v) for i, v in self.rows]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        # Metric.__init__ assigns an empty list; rows are the only way to add samples here.
        if value:
            raise TypeError("add samples to a GpuFamily through its rows")
