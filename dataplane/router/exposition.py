"""Metrics exposition: what GET /metrics answers, in Prometheus text format.

The counters are ``metering``'s cumulative totals per (endpoint id, tenant); the gauges are
every pod's in-flight requests and MU and whether it is ejected, read from the endpoints' live
state. With ``--workers N`` each worker writes its numbers to a file of a directory they share
(``write_snapshot``, once a second and before each scrape), and a scrape renders the sum of all
files (``metering.merge``), so it shows the whole router whichever worker it reaches.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from dataplane.router.endpoint_state import EndpointState
from dataplane.router.metering import Key, PodGauges, Stats, merge, snapshot
from dataplane.wire.load_samples import LATENCY_BUCKETS_S
from dataplane.wire.prometheus_text import family_header, label_value


def prometheus_text(totals: dict[Key, Stats], names: dict[int, str], pods: PodGauges) -> str:
    """Cumulative counters, with # HELP and # TYPE for every family and every label value
    escaped; pods: `PodGauges` rows."""
    out: list[str] = []
    # each key's label set escaped once per scrape, not once per family
    keys = sorted(totals)
    labels = {
        key: f'endpoint="{label_value(names.get(key[0], key[0]))}",endpoint_id="{key[0]}",'
        f'tenant="{label_value(key[1])}"'
        for key in keys
    }

    counters = (
        ("router_requests_total", "requests", "finished requests"),
        ("router_mu_total", "mu", "model units consumed"),
        ("router_tokens_in_total", "tokens_in", "prompt tokens"),
        ("router_tokens_out_total", "tokens_out", "generated tokens"),
        ("router_errors_total", "errors", "5xx answers and upstream failures"),
        ("router_throttled_total", "throttled", "429 answers"),
    )
    for metric, attr, help_ in counters:
        out += family_header(metric, "counter", help_)
        for key in keys:
            out.append(f"{metric}{{{labels[key]}}} {getattr(totals[key], attr)}")
    out += family_header("router_inflight_requests", "gauge", "requests in flight")
    for key in keys:
        out.append(f"router_inflight_requests{{{labels[key]}}} {totals[key].inflight}")
    out += family_header("router_request_duration_seconds", "histogram", "request latency")
    for key in keys:
        s, lbl = totals[key], labels[key]
        cum = 0
        for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), s.latency_buckets, strict=True):
            cum += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'router_request_duration_seconds_bucket{{{lbl},le="{le}"}} {cum}')
        out.append(f"router_request_duration_seconds_sum{{{lbl}}} {s.latency_sum_s}")
        out.append(f"router_request_duration_seconds_count{{{lbl}}} {s.requests}")
    out += family_header("router_pod_inflight_requests", "gauge", "requests in flight per pod")
    pod_rows = [
        (f'endpoint_id="{ep}",pod="{label_value(pod)}"', req, mu, unanswered, ej)
        for ep, pod, req, mu, unanswered, ej in pods
    ]
    for lbl, req, *_ in pod_rows:
        out.append(f"router_pod_inflight_requests{{{lbl}}} {req}")
    out += family_header("router_pod_inflight_mu", "gauge", "estimated MU in flight per pod")
    for lbl, _req, mu, *_ in pod_rows:
        out.append(f"router_pod_inflight_mu{{{lbl}}} {mu}")
    out += family_header(
        "router_pod_unanswered_mu",
        "gauge",
        "estimated MU in flight per pod with no byte of an answer yet (p2c-mu counts it twice)",
    )
    for lbl, _req, _mu, unanswered, _ej in pod_rows:
        out.append(f"router_pod_unanswered_mu{{{lbl}}} {unanswered}")
    out += family_header("router_pod_ejected", "gauge", "1 while a pod is ejected")
    for lbl, *_, ej in pod_rows:
        out.append(f"router_pod_ejected{{{lbl}}} {int(ej)}")
    return "\n".join(out) + "\n"


def pod_gauges(endpoints: Iterable[EndpointState]) -> tuple[dict[int, str], PodGauges]:
    """Endpoint names by id, and every pod's gauges."""
    eps = list(endpoints)
    names = {ep.spec.id: ep.spec.name for ep in eps}
    pods = [
        (ep.spec.id, p.name, p.inflight_requests, p.inflight_mu, p.unanswered_mu, p.ejected)
        for ep in eps
        for p in ep.pods
    ]
    return names, pods


def metrics_text(
    totals: dict[Key, Stats], endpoints: Iterable[EndpointState], metrics_dir: str | None
) -> str:
    """This process's counters; with a metrics directory (several workers), all workers'."""
    if metrics_dir is None:
        return prometheus_text(totals, *pod_gauges(endpoints))
    write_snapshot(totals, endpoints, metrics_dir)  # this worker's freshest numbers
    snaps = []
    for path in Path(metrics_dir).glob("*.json"):
        with contextlib.suppress(OSError, ValueError):  # a worker that is gone, or mid-rename
            snaps.append(json.loads(path.read_text()))
    return prometheus_text(*merge(snaps))


def write_snapshot(totals: dict[Key, Stats], endpoints: Iterable[EndpointState], metrics_dir: str) -> None:
    """This worker's numbers, as ``metrics_dir``/<pid>.json."""
    path = Path(metrics_dir) / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(snapshot(totals, *pod_gauges(endpoints))))
    tmp.replace(path)  # atomic: a scrape never reads half a file
