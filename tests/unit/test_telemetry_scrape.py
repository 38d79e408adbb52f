"""telemetry.scrape: the cached labelled children the hot paths count into."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from telemetry.scrape import labelled


def test_a_labelled_child_is_the_one_labels_makes_and_counts_where_it_would():
    registry = CollectorRegistry()
    claimed = Counter("claimed_runs", "runs", ["workspace"], registry=registry)
    fenced = Counter("fenced", "writes", ["workspace"], registry=registry)
    assert labelled(claimed, "ws-a") is claimed.labels("ws-a")
    # Another metric with the same label value has a child of its own.
    assert labelled(fenced, "ws-a") is fenced.labels("ws-a")
    assert labelled(fenced, "ws-a") is not labelled(claimed, "ws-a")
    for _ in range(3):
        labelled(claimed, "ws-a").inc()
    claimed.labels("ws-a").inc()
    labelled(claimed, "ws-b").inc()
    text = generate_latest(registry).decode()
    assert 'claimed_runs_total{workspace="ws-a"} 4.0' in text
    assert 'claimed_runs_total{workspace="ws-b"} 1.0' in text
    assert 'fenced_total{workspace="ws-a"} 0.0' in text
