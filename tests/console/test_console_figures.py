"""Figures for people: the console's one number rule (capacity.numbers) on the
capacity page of a fleet with awkward figures, a pool's have that no sale moves, the meaning
beside each figure, and benchmark events that read as sentences."""

import re
from datetime import timedelta
from fractions import Fraction
from html.parser import HTMLParser

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from capacity import numbers
from controlplane import profile_benchmarks
from controlplane.capacity.models import GpuPool, ModelProfile, StoredLedger
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.oncall.models import Event
from controlplane.pool_ledgers import refresh_pools
from controlplane.selling import sell
from controlplane.tasks import record_snapshots
from tests.test_profile_benchmarks import QUICK, TINY

# A number of 1 or more written with five decimals or more: "3388.235294", "1,234.56789".
LONG_DECIMALS = re.compile(r"(?<![\d.,])(\d[\d,]*)\.(\d{5,})")


class VisibleText(HTMLParser):
    """The text a browser shows of a page: no scripts, styles or attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._hidden += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._hidden -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.parts.append(data)


def visible_text(html: str) -> str:
    parser = VisibleText()
    parser.feed(html)
    return " ".join(parser.parts)


def long_decimals(text: str) -> list[str]:
    return [m.group(0) for m in LONG_DECIMALS.finditer(text) if int(m.group(1).replace(",", "")) >= 1]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (2880000, "2,880,000"),
        (Fraction(57600, 17), "3,388.24"),
        (3388.235294, "3,388.24"),
        (8.0, "8"),
        (2.5, "2.5"),
        (0.0523, "0.05"),
        (0.00681, "0.00681"),
        (6.81e-05, "6.81 \u00d7 10⁻⁵"),
        (7.27e-09, "7.27 \u00d7 10⁻⁹"),
        (-0.5, "-0.5"),
        (None, "—"),
    ],
)
def test_a_figure_is_written_for_people(value, shown):
    assert numbers.shown(value) == shown


def test_a_unit_is_singular_for_one_and_the_exact_value_is_kept_for_a_title():
    assert [numbers.with_unit(n, "GPU") for n in (1, 8, 0.999)] == ["1 GPU", "8 GPUs", "1 GPU"]
    assert numbers.with_unit(3, "MU/min") == "3 MU/min" and numbers.with_unit(2, "replica") == "2 replicas"
    assert numbers.exact(Fraction(57600, 17)) == "3388.235294117647 (57600/17)"
    assert numbers.rounded(Fraction(57600, 17)) and not numbers.rounded(2880000) and not numbers.rounded(2.5)


@pytest.fixture
def awkward_fleet(settings, h100, owner, other, make_endpoint, small_model, big_model):
    """Two pools of three models, one of 97 MU/min on 3 GPUs with a fitted price of small and
    negative coefficients; over-commit 1.07; an endpoint metered at 1,234.5678912 MU/min."""
    settings.CAPACITY_OVERCOMMIT = 1.07
    wide = GpuPool.objects.create(
        name="wide", gpu_type=h100, region="us-west-2", gpu_count=24, gpus_per_node=8
    )
    odd = ModelProfile.objects.create(
        model="mistral-odd", gpu_type=h100, alpha=6.81e-05, beta=0.00123456, gamma=-0.000123,
        rho=3.3e-06, kappa=7.27e-09, gpus_per_replica=3, mu_per_replica_minute=97, r2=0.99876543,
        heldout_mape=0.0123456, samples=16, source="benchmark",
    )  # fmt: skip
    chat = make_endpoint(owner, "chat")
    big = make_endpoint(other, "big", profile=big_model, pool=wide)
    odd_one = make_endpoint(owner, "odd", profile=odd, pool=wide, min_provisioned_concurrency=8)
    make_endpoint(other, "batch", pool=wide)
    sell(chat, mu_per_minute=333, best_effort_allowed=True, sold_by="t")
    sell(odd_one, mu_per_minute=150, best_effort_allowed=True, sold_by="t")
    Endpoint.objects.filter(pk=chat.pk).update(used_mu_per_minute=1234.5678912)
    Pod.objects.create(endpoint=odd_one, name="odd-0", url="http://10.0.0.9:1", ready=True)
    refresh_pools([chat.pool_id, wide.pk])
    record_snapshots()  # the history chart draws them
    return {"chat": chat, "big": big, "odd": odd_one, "wide": wide}


def test_no_figure_of_1_or_more_on_the_capacity_page_has_five_decimals(operator_web, awkward_fleet):
    found = long_decimals("have 3388.235294 MU/min, 0.000068 and 1,234.56789")
    assert found == ["3388.235294", "1,234.56789"]  # the scan catches what it is for
    html = operator_web.get("/console/capacity/").content.decode()
    text = visible_text(html)
    assert long_decimals(text) == []
    # The figures behind it are awkward: the page rounds them and keeps the exact value in a title.
    assert "1,234.57" in text and 'title="1234.5678912"' in html
    assert "6.81 \u00d7 10⁻⁵" in text and "7.27 \u00d7 10⁻⁹" in text and "-1.23 \u00d7 10⁻⁴" in text
    assert re.search(r"\b1 GPUs\b", text) is None and "of 1 GPU" in text and "of 3 GPUs" in text


def test_each_coefficient_and_ledger_figure_says_what_it_means(operator_web, awkward_fleet):
    html = operator_web.get("/console/capacity/").content.decode()
    for words in (
        "MU per input token: what prefill costs",
        "It may be negative",  # gamma's
        "log2(output tokens)",  # rho's
        "KV-cache token-step",  # kappa's
        "node_count x gpus_per_node",  # the pool's have, as the API's schema says
        "never with a sale",
        "what this model alone would fill the pool",
    ):
        assert f"{words}" in html.replace("&#x27;", "'"), words
    pool = awkward_fleet["wide"]
    grid = operator_web.get(f"/console/capacity/pools/{pool.pk}/nodes/").content.decode()
    assert long_decimals(visible_text(grid)) == []
    assert "3 nodes \u00d7 8 GPUs" in grid and "Free GPUs no replica of a model placed here can use" in grid


def test_a_sale_moves_no_pools_have(operator_client, awkward_fleet):
    def pools():
        return {row["pool"]: row for row in operator_client.get("/api/v1/capacity/").json()}

    before = pools()
    sold = operator_client.patch(
        f"/api/v1/reservations/{awkward_fleet['odd'].reservation.pk}/", {"mu_per_minute": 390}, format="json"
    )
    assert sold.status_code == 200, sold.content
    bought = operator_client.post(
        "/api/v1/reservations/", {"endpoint": awkward_fleet["big"].pk, "mu_per_minute": 100}, format="json"
    )
    assert bought.status_code == 201, bought.content
    after = pools()
    assert after["wide"]["sold_mu_per_minute"] == before["wide"]["sold_mu_per_minute"] + 240 + 100
    assert after["wide"]["committed_gpus"] > before["wide"]["committed_gpus"]
    for name, row in before.items():
        for field in ("have_gpus", "have_mu_per_minute", "sellable_mu_per_minute"):
            assert after[name][field] == row[field], (name, field)
        assert [m["have_mu_per_minute"] for m in after[name]["models"]] == [
            m["have_mu_per_minute"] for m in row["models"]
        ]
    # The wide pool's MU/min is the mean of what each model alone fills it with: 24 GPUs hold 24
    # replicas of the 8B (2,400), 6 of the 70B (600) and 6 of the 3-GPU one at 97 (582).
    assert before["wide"]["have_mu_per_minute"] == pytest.approx((2400 + 600 + 582) / 3, abs=1e-6)


def test_a_ledger_stored_by_the_earlier_rule_is_counted_again_when_read(operator_client, awkward_fleet):
    stored = StoredLedger.objects.get(pool=awkward_fleet["wide"])
    blended = {k: v for k, v in stored.figures.items() if k != "default_mu_per_gpu"}
    StoredLedger.objects.filter(pk=stored.pk).update(figures={**blended, "mu_per_gpu": "1000"})
    row = next(r for r in operator_client.get("/api/v1/capacity/").json() if r["pool"] == "wide")
    assert row["have_mu_per_minute"] == pytest.approx(1194, abs=1e-6)
    assert "default_mu_per_gpu" in StoredLedger.objects.get(pk=stored.pk).figures


def test_a_benchmark_event_is_a_sentence_with_the_profile_then_the_numbers(small_model, settings):
    settings.BENCHMARK_MAX_HELDOUT_MAPE = 0.0  # nothing real is that good: refused
    profile_benchmarks.run_benchmark(small_model, config=QUICK, driver=TINY)
    message = Event.objects.get(kind="benchmark").message
    link = f"/console/capacity/#profile-{small_model.pk}"
    assert message.startswith(f"The benchmark of {small_model} measured a price that was refused: ")
    assert link in message and message.index(link) < message.index("Measured: ")
    assert re.search(r"Measured: [^,]+ MU per input token \(alpha\), ", message)
    assert "e-0" not in message  # 6.81 x 10⁻⁵, not 6.81e-05
    assert Event.objects.get(kind="benchmark").detail["link"] == link


def test_the_on_call_row_links_the_profile_and_no_address_an_event_writer_chose(operator_web, db):
    """Events carry a detail their writer chose (pods write their own): only a console path
    becomes a link."""
    Event.record("benchmark", "The benchmark of m on g ...", detail={"link": "/console/capacity/#profile-7"})
    for hostile in ("javascript:alert(1)", "//evil.example/x", "https://evil.example/console/"):
        Event.record("benchmark", f"hostile {hostile}", detail={"link": hostile})
    Event.objects.update(recorded_at=timezone.now() - timedelta(minutes=1))  # settled: listed
    html = operator_web.get("/console/oncall/?view=events").content.decode()
    assert re.findall(r'<a class="detail-link" href="([^"]*)"', html) == ["/console/capacity/#profile-7"]


def test_the_schema_says_what_a_pools_have_is(db):
    schema = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    pool = schema["components"]["schemas"]["PoolCapacity"]["properties"]
    assert "never with a sale" in pool["have_mu_per_minute"]["description"]
    assert pool["have_gpus"]["description"] == "The pool's have: node_count x gpus_per_node"
    model = schema["components"]["schemas"]["ModelCapacity"]["properties"]
    assert "what this model alone would fill the pool" in model["have_mu_per_minute"]["description"]
