"""Metrics exposition: Prometheus text of the counters and pod gauges, GET /metrics of a router,
read back by prometheus_client's parser and by ``promtool check metrics`` with names that need
escaping (a pod named ``chat-"quoted"-pod``, a tenant and an endpoint with a backslash)."""

import asyncio
import shutil
import subprocess
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dataplane.router.exposition import prometheus_text
from dataplane.router.metering import Meter
from dataplane.wire.routing_table import RoutedPod
from tests.router.conftest import TENANT_KEY, call, routing_table, running, scrape, sha

KEY = (7, "acme")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
QUOTED_POD = 'chat-"quoted"-pod'
ODD_POD = "line\nbreak\\pod"
TENANT = "ac\\me"
ENDPOINT = "ch\\at"


def test_prometheus_text_has_counters_histogram_and_pod_gauges():
    m = Meter(0.0)
    m.start(KEY, 0.0)
    m.finish(KEY, 0.03, 0.03, 2.0, 5, 6, False)
    text = prometheus_text(m.totals, {7: "chat"}, [(7, "pod-0", 1, 2.5, 1.5, False)])
    assert 'router_requests_total{endpoint="chat",endpoint_id="7",tenant="acme"} 1' in text
    labels = 'endpoint="chat",endpoint_id="7",tenant="acme"'
    assert f'router_request_duration_seconds_bucket{{{labels},le="0.025"}} 0' in text
    assert f'router_request_duration_seconds_bucket{{{labels},le="0.05"}} 1' in text
    assert 'router_pod_inflight_mu{endpoint_id="7",pod="pod-0"} 2.5' in text
    assert 'router_pod_unanswered_mu{endpoint_id="7",pod="pod-0"} 1.5' in text
    assert "# TYPE router_mu_total counter" in text


def test_label_values_are_escaped():
    m = Meter(0.0)
    m.start((7, TENANT), 0.0)
    m.finish((7, TENANT), 0.03, 0.03, 2.0, 5, 6, False)
    text = prometheus_text(
        m.totals, {7: ENDPOINT}, [(7, QUOTED_POD, 1, 2.5, 0.0, False), (7, ODD_POD, 0, 0.0, 0.0, True)]
    )
    assert 'router_mu_total{endpoint="ch\\\\at",endpoint_id="7",tenant="ac\\\\me"} 2.0' in text
    assert 'router_pod_ejected{endpoint_id="7",pod="chat-\\"quoted\\"-pod"} 0' in text
    assert 'router_pod_ejected{endpoint_id="7",pod="line\\nbreak\\\\pod"} 1' in text


def test_metrics_endpoint_of_a_running_router():
    async def go():
        async with running(1) as (router, _):
            await call(router, body={"model": "m", "prompt": "hi"})
            status, headers, body = await call(router, path="/metrics", method="GET")
            assert status == 200 and headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert b'router_requests_total{endpoint="*",endpoint_id="0",tenant=""} 1' in body

    asyncio.run(go())


def odd_names_table(fakes):
    """Tenant ac\\me's endpoint ch\\at on two pods, one with quotes and one with a line feed."""
    pods = (RoutedPod(QUOTED_POD, fakes[0].url, True), RoutedPod(ODD_POD, fakes[1].url, True))
    return replace(
        routing_table(fakes, tenant=TENANT, name=ENDPOINT, pods=pods), api_keys={sha(TENANT_KEY): TENANT}
    )


def test_the_scrape_with_odd_names_parses_with_every_family_documented():
    async def go():
        async with running(2, table=odd_names_table) as (router, _):
            for _ in range(4):
                status, headers, _ = await call(
                    router, body={"model": ENDPOINT, "prompt": "hi"}, key=TENANT_KEY
                )
                assert status == 200 and headers["x-pod"] in (QUOTED_POD, "line\\nbreak\\\\pod")
            families = await scrape(router)
            for family in families.values():
                assert family.documentation and family.type != "unknown", family.name
            for name in ("router_errors", "router_mu", "router_tokens_out"):  # the contract, per endpoint
                (sample,) = families[name].samples
                assert sample.labels == {"endpoint": ENDPOINT, "endpoint_id": "1", "tenant": TENANT}
            assert families["router_tokens_out"].samples[0].value == 80
            pods = {s.labels["pod"] for s in families["router_pod_ejected"].samples}
            assert pods == {QUOTED_POD, ODD_POD}

    asyncio.run(go())


@pytest.mark.skipif(not shutil.which(PROMTOOL), reason="needs promtool (Debian's prometheus package)")
def test_promtool_accepts_the_scrape_with_odd_names():
    async def go():
        async with running(2, table=odd_names_table) as (router, _):
            await call(router, body={"model": ENDPOINT, "prompt": "hi"}, key=TENANT_KEY)
            _, _, body = await call(router, path="/metrics", method="GET")
            return body

    body = asyncio.run(go())
    assert list(text_string_to_metric_families(body.decode()))  # parses before promtool lints it
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
