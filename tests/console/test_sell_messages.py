"""What the sell form and the endpoint form say, server side: a refused sale worded from the
pool's point of view (what it has, what is committed, what the sale needs, how many fit) in the
same slot as the preview, so that the next preview replaces it; and an endpoint form that names
every error at once, each beside its field, as the API's 400 does."""

import re

import pytest

from controlplane.capacity.models import Reservation
from controlplane.endpoints.models import Endpoint
from controlplane.selling import sell

# The pool of tests/conftest.py: one node of 8 H100s; llama-8b is 100 MU/min per 1-GPU replica.
HAS = "It has 8 GPUs (1 node x 8 GPUs)"


@pytest.fixture
def chat(owner, make_endpoint):
    endpoint = make_endpoint(owner, "chat")
    sell(endpoint, mu_per_minute=300, best_effort_allowed=True, sold_by="t")  # 3 replicas
    return endpoint


def sell_slot(html: str) -> str:
    """The one slot under the sell form where a preview or a Sell's outcome shows."""
    return re.search(r'<div id="sell-preview".*?</div>', html, re.S).group(0)


def test_a_refused_sale_says_what_the_pool_has_what_is_committed_and_what_the_sale_needs(operator_web, chat):
    refused = operator_web.post(
        "/console/capacity/sell/", {"endpoint": "owner/chat", "mu_per_minute": "50000"}
    )
    assert refused.status_code == 409
    slot = sell_slot(refused.content.decode())
    assert (
        "<b>Refused</b>: pool &#x27;use1-h100&#x27; cannot place this. " + HAS + "; 3 GPUs are committed to"
        " reservations and minimum replicas (3 replicas, 300 MU/min; sold: 3 replicas = 300 MU/min at"
        " over-commit 1), 5 GPUs are free, 0 of them stranded. This needs 500 replicas of 1 GPU (500 GPUs,"
        " 50,000 MU/min), where the endpoint commits 3 replicas (3 GPUs) now; at most 8 fit." in slot
    )
    # The slot does not load a preview on top of the refusal; a change to the form does.
    trigger = re.search(r'hx-trigger="([^"]*)"', slot).group(1)
    assert not trigger.startswith("load") and "input changed" in trigger
    assert Reservation.objects.get(endpoint=chat).mu_per_minute == 300


def test_the_preview_that_replaces_a_refusal_is_the_preview_alone(operator_web, chat):
    fits = operator_web.get("/console/capacity/preview/", {"endpoint": "owner/chat", "mu_per_minute": "500"})
    slot = sell_slot(fits.content.decode())
    assert "<b>Fits</b> in pool use1-h100" in slot and "Refused" not in slot and "error" not in slot
    assert 'hx-trigger="load, input changed' in slot  # on the page, the preview loads at once
    # Said for a planner: the endpoint's GPUs after and now, apart from what it reserves.
    assert (
        'owner/chat would commit <span class="asked">5</span> GPUs (500 MU/min), for 500 MU/min reserved'
        " and a minimum of 0 concurrent (1 replica), where it commits 3 GPUs now." in slot
    )


def test_a_preview_that_would_not_fit_says_what_the_sale_would_be_refused_with(operator_web, chat):
    preview = operator_web.get(
        "/console/capacity/preview/", {"endpoint": "owner/chat", "mu_per_minute": "50000"}
    )
    verdict = re.search(r'<p class="verdict over">(.*?)</p>', preview.content.decode(), re.S).group(1)
    assert verdict.startswith("<b>Would not fit</b>: pool &#x27;use1-h100&#x27; cannot place this. " + HAS)
    assert "This needs 500 replicas of 1 GPU (500 GPUs, 50,000 MU/min)" in verdict
    assert "for 50,000 MU/min reserved" in verdict


FORM = {
    "name": "support-bot", "model": "llama-8b", "gpu_type": "h100-80gb", "pool": "",
    "min_provisioned_concurrency": "9", "max_provisioned_concurrency": "3",
    "target_concurrency_per_replica": "", "routing_policy": "p2c-mu", "region_preference": "",
}  # fmt: skip


def field_errors(html: str) -> dict[str, str]:
    return dict(re.findall(r'<p class="error" data-field="([^"]+)">(.*?)</p>', html, re.S))


def test_the_endpoint_form_shows_every_error_at_once_beside_its_field(owner_web, pool, small_model):
    # A name too long to parse and a minimum over the maximum: independent, so both are named.
    answer = owner_web.post(
        "/console/endpoints/new/", {**FORM, "name": "a" * 64, "region_preference": "US-East"}
    )
    assert answer.status_code == 400
    html = answer.content.decode()
    errors = field_errors(html)
    assert errors == {
        "name": "use 1-63 lowercase letters, digits and &#x27;-&#x27;, starting and ending with a letter or"
        " digit Ensure this field has no more than 63 characters.",
        "region_preference": "a region is 1-63 lowercase letters, digits and &#x27;-&#x27; (as us-east-1)",
        "min_provisioned_concurrency": (
            "min_provisioned_concurrency (9) must not exceed max_provisioned_concurrency (3)"
        ),
    }
    assert "Not saved: fix the 3 fields marked below." in html
    # Each beside its field: the error follows its own input.
    assert re.search(
        r'name="min_provisioned_concurrency"[^>]*></label>\s*'
        r'<p class="error" data-field="min_provisioned_concurrency"',
        html,
    )
    assert not Endpoint.objects.exists()


def test_the_apis_400_names_every_error_at_once_too(owner_client, pool, small_model):
    body = {"name": "Not A Name", "model": "llama-8b", "gpu_type": "h100-80gb",
            "min_provisioned_concurrency": 9, "max_provisioned_concurrency": 3}  # fmt: skip
    refused = owner_client.post("/api/v1/endpoints/", body, format="json")
    assert refused.status_code == 400
    assert set(refused.json()["fields"]) == {"name", "min_provisioned_concurrency"}
    # A rule whose field did not parse is not checked: a minimum that is not a number is that error alone.
    refused = owner_client.post(
        "/api/v1/endpoints/", {**body, "min_provisioned_concurrency": "x"}, format="json"
    )
    assert refused.json()["fields"]["min_provisioned_concurrency"]["errors"] == [
        "A valid integer is required."
    ]
