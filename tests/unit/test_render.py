"""Rendering /metrics: byte-equal to prometheus_client's text format, minus _created series."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from service.costs.integrals import Thresholds
from service.costs.prices import PriceRow
from service.exposition.families import GpuFamily
from service.exposition.fleet import fleet_families
from service.exposition.render import WithoutCreated, encode_text, render
from service.exposition.types import FleetGpu, FleetSnapshot, LostGpu
from service.vocabulary import DCGM_FIELDS


def registry() -> CollectorRegistry:
    r = CollectorRegistry()
    Counter("demo_events", "Events.", ["outcome"], registry=r).labels("ok").inc(3)
    Histogram("demo_seconds", "Durations.", registry=r).observe(0.2)
    Gauge("demo_level", "Level.", registry=r).set(7)
    return r


class Tricky(Collector):
    """Label values that need escaping, odd floats, timestamps, shared label dicts."""

    def collect(self):
        g = GaugeMetricFamily(
            "tricky_value", 'Help with \\ backslash\nand "quotes".', labels=["a", "b"]
        )
        g.add_metric(['q"uote', "back\\slash"], 1.5)
        g.add_metric(["new\nline", "ünïcødé ✓"], math.inf)
        g.add_metric(["nan", ""], math.nan, timestamp=1700000000.123)
        g.add_metric(["neg", "x"], -math.inf)
        g.add_metric(["big", "x"], 1e21)
        g.add_metric(["int", "x"], 42)
        g.add_metric(["float", "x"], 42.0)
        g.add_metric(["zero", "x"], 0.0)
        g.add_metric(["negzero", "x"], -0.0)
        g.add_metric(["tiny", "x"], 1e-300)
        yield g
        m = Metric("untyped_thing", "Untyped.", "unknown")
        m.add_sample("untyped_thing", {"z": "1", "a": "2"}, 3.0)
        yield m


def full_registry() -> CollectorRegistry:
    r = registry()
    Summary("demo_summary", "A summary.", ["k"], registry=r).labels("v").observe(1.0)
    Info("demo_build", "Build info.", registry=r).info({"version": "1.0"})
    Enum("demo_state", "A state.", states=["a", "b"], registry=r).state("b")
    Histogram("demo_lat", "Latency.", ["route"], buckets=(0.1, 1), registry=r).labels("/x").observe(
        3
    )
    r.register(Tricky())
    return r


def test_encode_text_is_byte_equal_to_generate_latest():
    r = full_registry()
    assert encode_text(r) == generate_latest(r)
    assert encode_text(WithoutCreated(r)) == generate_latest(WithoutCreated(r))


def test_encode_text_equals_generate_latest_on_fleet_families():
    now = datetime(2026, 12, 2, 8, tzinfo=UTC)
    readings = [
        FleetGpu(
            node=f"node-{i // 8}",
            index=i % 8,
            uuid=f"GPU-{i}",
            model="NVIDIA H100 80GB HBM3",
            last_sample_at=now,
            values={"sm_active": i / 40, "energy_joules": 1e6 + i, "fb_used_bytes": 2**31},
            job_id=f"slurm:{i}" if i % 2 else None,
            user='al"ice' if i % 2 else None,
        )
        for i in range(40)
    ]
    fams = fleet_families(
        FleetSnapshot(readings, [LostGpu("n", 1, "GPU-l", "m")], [PriceRow("*", 2.0, now)]),
        thresholds=Thresholds(),
        now=now,
        dcgm_compat=True,
    )

    class Fixed(Collector):
        def collect(self):
            return fams

    # Byte-equal but for the compat counters: dcgm-exporter names their samples without
    # _total, and their TYPE lines name those samples, which generate_latest cannot write.
    expected = generate_latest(Fixed())
    for f in DCGM_FIELDS:
        if f.prom_type == "counter":
            for line in ("HELP", "TYPE"):
                old = f"# {line} {f.name}_total ".encode()
                assert old in expected
                expected = expected.replace(old, f"# {line} {f.name} ".encode())
    assert encode_text(Fixed()) == expected


def test_text_format_has_no_created_series_but_keeps_the_rest():
    body, content_type = render(registry())
    text = body.decode()
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "_created" not in text
    assert 'demo_events_total{outcome="ok"} 3.0' in text
    assert "demo_seconds_count 1.0" in text
    assert "demo_level 7.0" in text


def test_the_registry_itself_still_has_created_samples():
    # The filter is a view: prometheus_client's global default stays untouched.
    names = {s.name for fam in registry().collect() for s in fam.samples}
    assert "demo_events_created" in names


def test_number_formatting_matches_prometheus_client_for_many_values():
    import random

    rng = random.Random(7)
    values: list[float] = [0.0, -0.0, 1e6, 999999.5, 1234567.0, 1e21, 1e-7, 5e-324, 2**63, 3]
    values += [math.inf, -math.inf, math.nan, 1.7976931348623157e308, -12345678.0]
    values += [rng.uniform(-1e12, 1e12) for _ in range(3000)]
    values += [rng.random() * 10 ** rng.randrange(-10, 25) for _ in range(3000)]
    values += [float(rng.randrange(0, 2**40)) for _ in range(1000)]
    values += [rng.randrange(0, 2**40) for _ in range(100)]  # ints take the library's path

    class Many(Collector):
        def collect(self):
            g = GaugeMetricFamily("many_values", "Values.", labels=["i"])
            for i, v in enumerate(values):
                g.add_metric([str(i % 50)], v)
            yield g

    assert encode_text(Many()) == generate_latest(Many())

    sets = [{"gpu": str(i), "uuid": f"GPU-{i}"} for i in range(50)]

    class ManyGpu(Collector):
        def collect(self):
            for typ in ("gauge", "counter"):
                fam = GpuFamily(f"many_gpu_{typ}", "Values.", typ, sets)
                fam.rows = [(i % 50, v) for i, v in enumerate(values)]
                yield fam

    assert encode_text(ManyGpu()) == generate_latest(ManyGpu())


def test_gpu_family_label_sets_escape_like_prometheus_client():
    sets = [
        {"node": "n1", "uuid": "GPU-1", "job_id": ""},
        {"node": 'q"uote', "uuid": "back\\slash", "job_id": "new\nline"},
        {"node": "nul\x00inside", "uuid": "x", "job_id": "y"},
        {"uuid": "other-order", "node": "n2", "job_id": "{braces}"},
        {"node": "n3", "uuid": "fewer-keys"},
        {"node": "ünïcødé ✓", "uuid": "GPU-2", "job_id": "slurm:1", "team": "extra"},
    ]

    class Sets(Collector):
        def collect(self):
            fam = GpuFamily("label_sets_value", "Values.", "gauge", sets)
            fam.rows = [(i, float(i)) for i in range(len(sets))]
            yield fam

    text = encode_text(Sets())
    assert text == generate_latest(Sets())
    assert b'node="q\\"uote"' in text and b'job_id="{braces}"' in text
