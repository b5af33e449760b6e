"""Metrics exposition: Prometheus text of the counters and pod gauges, GET /metrics of a router."""

import asyncio

from dataplane.router.exposition import prometheus_text
from dataplane.router.metering import Meter
from tests.router.conftest import call, running

KEY = (7, "acme")


def test_prometheus_text_has_counters_histogram_and_pod_gauges():
    m = Meter(0.0)
    m.start(KEY, 0.0)
    m.finish(KEY, 0.03, 0.03, 2.0, 5, 6, False)
    text = prometheus_text(m.totals, {7: "chat"}, [(7, "pod-0", 1, 2.5, False)])
    assert 'router_requests_total{endpoint="chat",endpoint_id="7",tenant="acme"} 1' in text
    labels = 'endpoint="chat",endpoint_id="7",tenant="acme"'
    assert f'router_request_duration_seconds_bucket{{{labels},le="0.025"}} 0' in text
    assert f'router_request_duration_seconds_bucket{{{labels},le="0.05"}} 1' in text
    assert 'router_pod_inflight_mu{endpoint_id="7",pod="pod-0"} 2.5' in text
    assert "# TYPE router_mu_total counter" in text


def test_metrics_endpoint_of_a_running_router():
    async def go():
        async with running(1) as (router, _):
            await call(router, body={"model": "m", "prompt": "hi"})
            status, headers, body = await call(router, path="/metrics", method="GET")
            assert status == 200 and headers["content-type"].startswith("text/plain")
            assert b'router_requests_total{endpoint="*",endpoint_id="0",tenant=""} 1' in body

    asyncio.run(go())
