"""Rendering /metrics: no _created series, and OpenMetrics when the scraper asks for it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.exposition.render import render


def registry() -> CollectorRegistry:
    r = CollectorRegistry()
    Counter("demo_events", "Events.", ["outcome"], registry=r).labels("ok").inc(3)
    Histogram("demo_seconds", "Durations.", registry=r).observe(0.2)
    Gauge("demo_level", "Level.", registry=r).set(7)
    return r


def test_text_format_has_no_created_series_but_keeps_the_rest():
    body, content_type = render(registry(), None)
    text = body.decode()
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "_created" not in text
    assert 'demo_events_total{outcome="ok"} 3.0' in text
    assert "demo_seconds_count 1.0" in text
    assert "demo_level 7.0" in text


def test_openmetrics_on_request_without_created():
    body, content_type = render(
        registry(), "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
    )
    text = body.decode()
    assert content_type.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    assert "_created" not in text
    assert 'demo_events_total{outcome="ok"} 3.0' in text


def test_the_registry_itself_still_has_created_samples():
    # The filter is a view: prometheus_client's global default stays untouched.
    names = {s.name for fam in registry().collect() for s in fam.samples}
    assert "demo_events_created" in names
