"""The routing-table contract: the table the control plane serves is the table routers read."""

import pytest

from capacity.units import DEFAULT_MAX_MODEL_LEN, CostModel
from controlplane.endpoints.models import Pod
from controlplane.endpoints.routing import routing_table
from controlplane.selling import sell
from dataplane.wire.routing_table import KeyEpoch, ReservedRate, RoutedEndpoint, RoutedPod, RoutingTable

CHAT = RoutedEndpoint(
    id=7,
    tenant="acme",
    name="chat",
    model="llama-8b",
    policy="least-request",
    coefficients=CostModel(0.0004, 0.004, 0.02),
    mu_per_replica_minute=100.0,
    target_concurrency=8,
    scale_to_zero_enabled=True,
    reservation=ReservedRate(300.0, best_effort_allowed=False),
    pods=(
        RoutedPod("chat-0", "http://10.0.0.1:8000", True, "1"),
        RoutedPod("chat-1", "http://10.0.0.2:8000", False, "2"),
    ),
    traffic=(("1", 90.0), ("2", 10.0)),
    max_model_len=8192,
    max_token_bytes=4,
    served_model_name="support",
)


def test_the_table_round_trips_through_json_and_the_api(operator_client, owner_client, owner, make_endpoint):
    table = RoutingTable("v7", (CHAT,), {"ab" * 32: "acme"}, key_epochs={"acme": KeyEpoch(3, 2)})
    assert RoutingTable.from_json(table.to_json()) == table
    # The writer and the reader: what the control plane serves reads back as what it wrote.
    chat = make_endpoint(owner, "chat")
    chat.profile.max_model_len = 4096  # the model's context length reaches the routers (its pods serve 8,192)
    chat.profile.save()
    sell(chat, mu_per_minute=300, best_effort_allowed=False, sold_by="t")
    Pod.objects.create(endpoint=chat, name="chat-0", url="http://127.0.0.1:9001", ready=True)
    served = RoutingTable.from_json(operator_client.get("/api/v1/routing-table/").json())
    assert served == routing_table()
    assert served.endpoints[0].reservation == ReservedRate(300, best_effort_allowed=False)
    assert [p.name for p in served.endpoints[0].pods] == ["chat-0"] and not served.api_keys  # looked up
    assert (served.endpoints[0].max_model_len, served.endpoints[0].max_token_bytes) == (4096, 4)
    assert served.endpoints[0].served_model_name == "chat"  # the name it was created under


def test_an_older_writer_s_table_reads_the_default_context_length_and_an_unknown_tokenizer():
    doc = RoutingTable("v7", (CHAT,), {}).to_json()
    del doc["endpoints"][0]["max_model_len"], doc["endpoints"][0]["max_token_bytes"]
    read = RoutingTable.from_json(doc).endpoints[0]
    assert (read.max_model_len, read.max_token_bytes) == (DEFAULT_MAX_MODEL_LEN, 0)


def test_an_older_writer_s_table_reads_pods_serving_the_name_asked():
    doc = RoutingTable("v7", (CHAT,), {}).to_json()
    assert doc["endpoints"][0]["served_model_name"] == "support"
    del doc["endpoints"][0]["served_model_name"]
    assert RoutingTable.from_json(doc).endpoints[0].served_model_name == ""
    doc["endpoints"][0]["served_model_name"] = 7
    with pytest.raises(ValueError, match=r"endpoints\[0\]\.served_model_name must be a string, got 7"):
        RoutingTable.from_json(doc)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "8192", True, None])
def test_a_bad_context_length_is_refused_naming_it(bad):
    doc = RoutingTable("v7", (CHAT,), {}).to_json()
    doc["endpoints"][0]["max_model_len"] = bad
    with pytest.raises(ValueError, match=r"endpoints\[0\]\.max_model_len must be an integer >= 1"):
        RoutingTable.from_json(doc)


@pytest.mark.parametrize("bad", [-1, 1.5, "4", True, None])
def test_a_bad_token_size_is_refused_naming_it(bad):
    doc = RoutingTable("v7", (CHAT,), {}).to_json()
    doc["endpoints"][0]["max_token_bytes"] = bad
    with pytest.raises(ValueError, match=r"endpoints\[0\]\.max_token_bytes must be an integer >= 0"):
        RoutingTable.from_json(doc)


def test_a_bad_table_is_refused_naming_the_field_and_value():
    doc = RoutingTable("v7", (CHAT,), {}).to_json()
    doc["endpoints"][0]["mu_per_replica_minute"] = -1
    with pytest.raises(
        ValueError, match=r"endpoints\[0\]\.mu_per_replica_minute must be a finite number >= 0, got -1"
    ):
        RoutingTable.from_json(doc)


def test_a_negative_gamma_profile_gives_a_table_the_routers_read(
    operator_client, owner, make_endpoint, small_model
):
    """gamma down to -beta is a valid price (a fitted intercept): the served table carries it and
    every router reads it, rather than refusing the whole table for one profile."""
    small_model.gamma = -0.002  # >= -beta (0.004): valid for CostModel, the DB constraint and the API
    small_model.full_clean()
    small_model.save()
    make_endpoint(owner, "chat")
    served = RoutingTable.from_json(operator_client.get("/api/v1/routing-table/").json())
    assert served.endpoints[0].coefficients.gamma == -0.002


@pytest.mark.parametrize(
    ("gamma", "why"),
    [
        (-0.005, r"gamma must be a finite number >= -beta \(-0.004\)"),
        (float("nan"), "gamma must be a finite"),
    ],
)
def test_a_gamma_below_minus_beta_or_not_finite_is_refused_naming_it(gamma, why):
    doc = RoutingTable("v7", (CHAT,), {}).to_json()
    doc["endpoints"][0]["gamma"] = gamma
    with pytest.raises(ValueError, match=r"endpoints\[0\].*" + why):
        RoutingTable.from_json(doc)


@pytest.mark.parametrize("mu_per_minute", [float("nan"), float("inf"), -6000.0])
def test_a_bad_reservation_in_the_table_is_refused_when_the_table_is_read(mu_per_minute):
    """NaN passes every comparison (it would admit everything), inf breaks the lease renewal."""
    with pytest.raises(ValueError, match=r"reservation\.mu_per_minute must be a finite number"):
        ReservedRate.from_json({"mu_per_minute": mu_per_minute, "best_effort_allowed": False})
