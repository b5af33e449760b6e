"""The load-sample contract: what a router publishes or posts is what the autoscaler reads."""

import asyncio
import os

import pytest
from redis.asyncio import Redis

from controlplane.endpoints.samples import DatabaseSeconds, RedisSeconds
from dataplane.router.metering import publish
from dataplane.wire.load_samples import EndpointSecond, QueueSample, RouterSecond, SampleError, TrafficSample
from tests.conftest import latencies

SECOND = 1_700_000_000
TRAFFIC = TrafficSample(
    7,
    "acme",
    requests=3,
    inflight=1.5,
    mu=4.5,
    mu_squared=6.75,
    squared_requests=3,
    tokens_in=30,
    tokens_out=60,
    latency_ms_sum=90.0,
    errors=1,
    throttled=2,
    latency_buckets=latencies({2: 1, 6: 2}),
)
QUEUE = QueueSample(7, queued=2, queued_mu=1.5)
# What the control plane reads of that second, field by field (no key spelled on either side).
READ = EndpointSecond(
    requests=3.0,
    inflight=1.5,
    mu=4.5,
    mu_squared=6.75,
    squared_requests=3.0,
    tokens_in=30.0,
    tokens_out=60.0,
    latency_ms_sum=90.0,
    errors=1.0,
    throttled=2.0,
    latency_buckets=tuple(map(float, latencies({2: 1, 6: 2}))),
    queued=2.0,
    queued_mu=1.5,
)


def test_samples_round_trip_through_json_redis_and_the_api(metrics, operator_client):
    posted = RouterSecond(SECOND, (TRAFFIC, QUEUE), "router-a")
    assert RouterSecond.from_json(posted.to_json()) == posted
    # With Redis: the router publishes, the autoscaler reads the endpoint's second.
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")

    async def go() -> None:
        client = Redis.from_url(url)
        try:
            await publish(client, posted, 120)
        finally:
            await client.aclose()

    asyncio.run(go())
    assert RedisSeconds(metrics).read([7], SECOND, SECOND) == ({SECOND}, {(7, SECOND): READ})
    # Without Redis: the router posts its second, the database holds it.
    answer = operator_client.post("/api/v1/load-samples/", posted.to_json(), format="json")
    assert answer.status_code == 201 and answer.json() == {"stored": 2}
    assert DatabaseSeconds().read([7], SECOND, SECOND) == ({SECOND}, {(7, SECOND): READ})


def test_a_bad_sample_is_refused_naming_the_field_and_value(operator_client):
    body = RouterSecond(SECOND, (TRAFFIC,), "router-a").to_json()
    body["rows"][0]["requests"] = -1
    with pytest.raises(
        SampleError, match=r"rows\[0\]\.requests must be an integer in 0\.\.1000000000, got -1"
    ):
        RouterSecond.from_json(body)
    answer = operator_client.post("/api/v1/load-samples/", body, format="json")
    assert answer.status_code == 400 and "rows[0].requests" in answer.json()["fields"]["rows"]["errors"][0]
    # An amount the tenant's traffic sizes, as hostile as a count: the squares of its MU.
    body["rows"][0].update(requests=3, mu_squared=float("nan"))
    with pytest.raises(SampleError, match=r"rows\[0\]\.mu_squared must be a number in 0\.\.1e\+12, got nan"):
        RouterSecond.from_json(body)
    # Squares no requests can have: 3 requests of 4.5 MU in all carry at least 3 x 1.5^2 = 6.75
    # (all of one size) and at most 4.5^2 = 20.25 (one of them all of it). Fewer would read lumpy
    # work as steady (the calm history's guard); 0 is a router from before the squares.
    for wrong in (6.7, 20.3):
        body["rows"][0].update(mu_squared=wrong)
        with pytest.raises(
            SampleError,
            match=rf"mu_squared must be 0 or in 6\.75\.\.20\.25 .*3 requests of 4\.5 MU.*got {wrong}",
        ):
            RouterSecond.from_json(body)
        answer = operator_client.post("/api/v1/load-samples/", body, format="json")
        assert (
            answer.status_code == 400 and "rows[0].mu_squared" in answer.json()["fields"]["rows"]["errors"][0]
        )
    for right in (0.0, 6.75, 20.25):
        body["rows"][0].update(mu_squared=right)
        assert RouterSecond.from_json(body).samples[0].mu_squared == right
    body["rows"][0].update(requests=0, mu=0.0, mu_squared=1.0)  # squares of no request
    with pytest.raises(SampleError, match=r"mu_squared must be 0 or in 0\.\.0 "):
        RouterSecond.from_json(body)
    # MU with no request counted reads as one request's: 600 MU in squares of 1e-300 (a spread
    # of 1e-154, the steadiest work there is) refused.
    body["rows"][0].update(requests=0, mu=600.0, mu_squared=1e-300)
    with pytest.raises(SampleError, match=r"mu_squared must be 0 or in 360000\.\.360000 "):
        RouterSecond.from_json(body)
    # A row's squares are all its requests' or none (a router before them): never some.
    body["rows"][0].update(requests=3, mu=4.5, mu_squared=6.75, squared_requests=2)
    with pytest.raises(SampleError, match=r"rows\[0\]\.squared_requests must be 0 or requests \(3\), got 2"):
        RouterSecond.from_json(body)
