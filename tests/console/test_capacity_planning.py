"""The capacity planning page: the API's figures, headroom per model, a sale's preview, the
forecast line, the biggest holders and each tenant's usage against what it bought."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.capacity import snapshots
from controlplane.capacity.models import CapacitySnapshot, GpuPool, Reservation
from controlplane.endpoints import usage
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.pool_ledgers import refresh_pools
from controlplane.selling import delete_endpoint, sell
from controlplane.tenants.models import Tenant
from dataplane.wire.load_samples import EndpointSecond


@pytest.fixture
def fleet(owner, other, make_endpoint, big_model):
    chat = make_endpoint(owner, "chat", min_provisioned_concurrency=16, max_provisioned_concurrency=64)
    sell(chat, mu_per_minute=300, best_effort_allowed=True, sold_by="t")
    batch = make_endpoint(other, "batch")
    Pod.objects.create(endpoint=batch, name="batch-0", url="http://10.0.0.9:1", ready=True)
    refresh_pools([batch.pool_id])  # as the pod sync does once it has written its pods
    return {"chat": chat, "batch": batch}


def hour_of(endpoint, start: int, mu: float) -> tuple[int, int, EndpointSecond]:
    """A second of the hour from `start` that metered `mu`, as the collector bills it."""
    return (endpoint.pk, start, EndpointSecond(mu=mu))


def cell(html: str, pool: str, css: str) -> str:
    row = re.search(rf'<tr class="[^"]*" data-pool="{pool}">(.*?)</tr>', html, re.S).group(1)
    return re.search(rf'<td class="num {css}">([^<]*)</td>', row).group(1)


def test_the_pool_figures_are_the_apis(operator_web, operator_client, fleet):
    html = operator_web.get("/console/capacity/").content.decode()
    for row in operator_client.get("/api/v1/capacity/").json():
        for css, key in [
            ("have", "have_gpus"), ("committed", "committed_gpus"), ("sold", "sold_gpus"),
            ("used", "used_gpus"), ("headroom", "headroom_gpus"), ("have-mu", "have_mu_per_minute"),
            ("committed-mu", "committed_mu_per_minute"), ("sold-mu", "sold_mu_per_minute"),
            ("used-mu", "used_mu_per_minute"),
        ]:  # fmt: skip
            assert float(cell(html, row["pool"], css).replace(",", "")) == pytest.approx(
                row[key], abs=0.01
            ), key
    # 300 MU/min reserved (3 GPUs) and the other endpoint's minimum replica (1): 8 - 4 = 4 left,
    # 400 MU/min of the 8B model = 4 replicas.
    assert "llama-8b: 400 MU/min = 4 replicas of 1 GPU" in html
    assert "/GPU-hour" in html and not re.search(r"\$\d+\.\d{3}", html)  # "$2.49", never "$2.4900"


def test_a_preview_says_what_a_sale_or_a_minimum_change_would_leave_and_writes_nothing(operator_web, fleet):
    def preview(**query):
        return operator_web.get("/console/capacity/preview/", {"endpoint": "owner/chat", **query})

    html = preview(mu_per_minute=500).content.decode()
    # chat commits 3 GPUs now (300 MU/min > its 2 minimum replicas), batch 1; 500 MU/min asks 5.
    assert "<b>Fits</b>" in html and '<span class="committed-after">6</span>' in html
    assert '<span class="headroom-before">4</span> → <span class="headroom-after">2</span>' in html
    assert "llama-8b 400 → 200 MU/min" in html
    html = preview(mu_per_minute=900).content.decode()
    assert "Would not fit" in html and '<span class="headroom-after">-2</span>' in html
    # A minimum of 48 concurrent at 8 per replica is 6 replicas: 6 GPUs in place of 3.
    html = preview(min_provisioned_concurrency=48).content.decode()
    assert '<span class="asked">6</span>' in html and "<b>Fits</b>" in html
    assert '<span class="headroom-after">1</span>' in html
    assert Reservation.objects.get(endpoint=fleet["chat"]).mu_per_minute == 300  # nothing written
    fleet["chat"].refresh_from_db()
    assert fleet["chat"].min_provisioned_concurrency == 16
    bad = preview(mu_per_minute="-3")
    assert bad.status_code == 400 and 'data-field="mu_per_minute"' in bad.content.decode()
    over = preview(min_provisioned_concurrency=999)
    assert over.status_code == 400 and "must not exceed the maximum, 64" in over.content.decode()


def test_a_preview_counts_the_endpoint_apart_from_those_alike_to_it(
    operator_web, other, make_endpoint, fleet
):
    """batch and two endpoints alike to it (one minimum replica each) are one group of the
    pool's grouped rows; the preview reads batch apart, so its what-if replaces its own replica
    and not its siblings'."""
    for name in ("batch-2", "batch-3"):
        make_endpoint(other, name)
    html = operator_web.get(
        "/console/capacity/preview/", {"endpoint": "other/batch", "mu_per_minute": 200}
    ).content.decode()
    # committed: chat 3 + batch and its siblings 3 = 6 of 8; batch's 2 in place of its 1: 7.
    assert '<span class="asked">2</span>' in html and '<span class="committed-after">7</span>' in html
    assert '<span class="headroom-before">2</span> → <span class="headroom-after">1</span>' in html
    assert "llama-8b 200 → 100 MU/min" in html and "<b>Fits</b>" in html


def test_the_forecast_line_follows_the_peak_that_recurs_at_the_same_hour(operator_web, fleet, pool):
    now = timezone.now()
    # The next hour peaked at 600, 650 and 700 MU/min on the three previous days, and 50 at every
    # other time: the median, 650, is the forecast peak; the chart says so against 800 sellable.
    next_hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    rows = []
    for day, peak in ((1, 600), (2, 650), (3, 700)):
        for minutes in range(0, 24 * 60, 30):
            at = now - timedelta(days=day) + timedelta(minutes=minutes - 12 * 60)
            in_peak = next_hour - timedelta(days=day) <= at < next_hour - timedelta(days=day, minutes=-60)
            rows.append(
                CapacitySnapshot(
                    pool=pool, at=at, have_gpus=8, sold_gpus=3, used_gpus=1, have_mu_per_minute=800,
                    sold_mu_per_minute=300, used_mu_per_minute=peak if in_peak else 50,
                )
            )  # fmt: skip
    snapshots.write(rows)
    html = operator_web.get("/console/capacity/").content.decode()
    assert "peak 650 MU/min in the next 24 h against 800 sellable" in html
    assert "— short" not in html


def test_the_biggest_holders_and_each_tenants_usage_against_its_reservation(operator_web, fleet):
    hour = int(timezone.now().timestamp()) // 3600 * 3600
    usage.record(
        [hour_of(fleet["chat"], hour - k * 3600, 9000.0) for k in range(4)]
        + [hour_of(fleet["batch"], hour - 3 * 86400, 700.0)]
    )
    html = operator_web.get("/console/capacity/").content.decode()
    holders = re.findall(r'data-holder="([^"]+)"', html)
    assert holders == ["owner/chat", "other/batch"]  # 3 committed GPUs before 1 running
    owner = re.search(r'<tr data-tenant="owner">(.*?)</tr>', html, re.S).group(1)
    # 300 MU/min x 1,440 = 432,000 MU a day bought; 36,000 used in the last 24 h: 8.3 %.
    assert '<td class="num reserved-day">432,000</td>' in owner
    assert '<td class="num used-day">36,000</td>' in owner
    assert re.search(r'<td class="num share"><span class="figure" title="0.083[0-9]*">8.3 %</span>', owner)
    other = re.search(r'<tr data-tenant="other">(.*?)</tr>', html, re.S).group(1)
    assert "best effort" in other and '<td class="num used-day">0</td>' in other


def test_the_sell_form_suggests_the_endpoints_the_operator_types(operator_web, owner_web, fleet):
    html = operator_web.get("/console/capacity/").content.decode()
    form = re.search(r'<form id="sell-form".*?</form>', html, re.S).group(0)
    assert '<input name="endpoint" list="sell-endpoints"' in form and "<option" not in form

    def suggested(text):
        answer = operator_web.get("/console/capacity/endpoints/", {"endpoint": text}, HTTP_HX_REQUEST="true")
        assert answer.status_code == 200
        return re.findall(r'<option value="([^"]+)">([^<]*)</option>', answer.content.decode())

    assert suggested("") == [
        ("other/batch", "llama-8b in use1-h100 · 0 MU/min now"),
        ("owner/chat", "llama-8b in use1-h100 · 300 MU/min now"),
    ]
    assert [v for v, _ in suggested("ow")] == ["owner/chat"]  # a tenant's name
    assert [v for v, _ in suggested("bat")] == ["other/batch"]  # an endpoint's own name
    assert [v for v, _ in suggested("owner/c")] == ["owner/chat"]
    assert suggested("owner/b") == suggested("nobody") == suggested("ow/chat") == []
    assert owner_web.get("/console/capacity/endpoints/", {"endpoint": "o"}).status_code == 403
    answer = operator_web.post(
        "/console/capacity/sell/", {"endpoint": "other/batch", "mu_per_minute": "200"}, HTTP_HX_REQUEST="true"
    )
    assert answer.status_code == 200 and "Sold 200 MU/min on other/batch" in answer.content.decode()
    assert 'name="endpoint" list="sell-endpoints" value="other/batch"' in answer.content.decode()


def test_the_suggestions_are_at_most_twenty_by_tenant_then_name(operator_web, owner, pool, small_model):
    Endpoint.objects.bulk_create(
        Endpoint(
            tenant=owner,
            name=f"chat-{i:02}",
            profile=small_model,
            pool=pool,
            max_provisioned_concurrency=8,
            target_concurrency_per_replica=8,
        )
        for i in range(25)
    )
    answer = operator_web.get("/console/capacity/endpoints/", {"endpoint": "owner/chat-"})
    assert re.findall(r'<option value="([^"]+)"', answer.content.decode()) == [
        f"owner/chat-{i:02}" for i in range(20)
    ]


def test_a_pools_node_grid_is_its_own_request(operator_web, owner_web, fleet, pool):
    html = operator_web.get("/console/capacity/").content.decode()
    assert 'class="node-grid"' not in html  # no placement on the page itself
    url = f"/console/capacity/pools/{pool.pk}/nodes/"
    assert f'hx-get="{url}" hx-trigger="toggle from:closest details"' in html
    grid = operator_web.get(url, HTTP_HX_REQUEST="true").content.decode()
    # chat's 3 reserved replicas and batch's minimum one on the pool's one node of 8 GPUs
    assert '<div class="node-grid" data-pool="use1-h100">' in grid
    assert 'title="owner/chat · llama-8b"' in grid and 'title="other/batch · llama-8b"' in grid
    assert '<span class="free-gpus">4</span> GPUs free' in grid
    assert operator_web.get("/console/capacity/pools/999999/nodes/").status_code == 404
    assert owner_web.get(url).status_code == 403


def test_the_page_reads_no_more_with_ten_times_the_endpoints(operator_web, h100, small_model):
    """The page reads the pools' stored ledgers and its ten holders: 300 endpoints in 3 pools
    cost the queries 30 do, and the HTML names no endpoint beyond the holders."""
    pools = [
        GpuPool.objects.create(name=f"big-{i}", gpu_type=h100, region="r", gpu_count=800) for i in range(3)
    ]
    tenants = [Tenant.objects.create(name=f"t{i}") for i in range(10)]

    def grow(start, stop):
        made = Endpoint.objects.bulk_create(
            Endpoint(
                tenant=tenants[i % 10], name=f"e{i}", profile=small_model, pool=pools[i % 3],
                min_provisioned_concurrency=8 * (i % 4), max_provisioned_concurrency=64,
                target_concurrency_per_replica=8,
            )
            for i in range(start, stop)
        )  # fmt: skip
        Reservation.objects.bulk_create(Reservation(endpoint=e, mu_per_minute=100) for e in made[::3])
        Pod.objects.bulk_create(
            Pod(endpoint=e, name=f"{e.name}-0", url="http://10.0.0.9:1", ready=True) for e in made[::5]
        )
        refresh_pools([p.pk for p in pools])  # as the writes do

    def page():
        with CaptureQueriesContext(connection) as queries:
            response = operator_web.get("/console/capacity/")
        assert response.status_code == 200
        return len(queries), response.content.decode()

    grow(0, 30)
    few, html = page()
    assert len(set(re.findall(r"\bt\d/e\d+\b", html))) == 10
    grow(30, 300)
    many, html = page()
    assert many == few
    named = set(re.findall(r"\bt\d/e\d+\b", html))
    assert named == set(re.findall(r'data-holder="([^"]+)"', html)) and len(named) == 10
    assert "<datalist" in html and "<option" not in html.split("<datalist", 1)[1].split("</datalist>")[0]


def test_a_deleted_endpoints_usage_stays_in_its_tenants_usage(operator_web, fleet):
    hour = int(timezone.now().timestamp()) // 3600 * 3600
    usage.record([hour_of(fleet["batch"], hour - k * 3600, 500.0) for k in range(3)])
    delete_endpoint(fleet["batch"])
    page = operator_web.get("/console/capacity/")
    assert page.status_code == 200
    other = re.search(r'<tr data-tenant="other">(.*?)</tr>', page.content.decode(), re.S).group(1)
    assert '<td class="num used-day">1,500</td>' in other
