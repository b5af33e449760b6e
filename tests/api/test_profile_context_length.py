"""A model profile's context length (``max_model_len``): set through the API, served in the
routing table, where the routers bound an output budget by it."""

from capacity.units import DEFAULT_MAX_MODEL_LEN
from controlplane.endpoints.routing import routing_table


def test_the_context_length_is_set_on_the_profile_and_reaches_the_routing_table(
    operator_client, owner, make_endpoint, small_model
):
    make_endpoint(owner, "chat")
    url = f"/api/v1/model-profiles/{small_model.pk}/"
    assert operator_client.get(url).json()["max_model_len"] == DEFAULT_MAX_MODEL_LEN
    assert routing_table().endpoints[0].max_model_len == DEFAULT_MAX_MODEL_LEN
    changed = operator_client.patch(url, {"max_model_len": 131_072}, format="json")
    assert changed.status_code == 200 and changed.json()["max_model_len"] == 131_072
    assert routing_table().endpoints[0].max_model_len == 131_072


def test_a_context_length_below_one_token_is_refused_naming_it(operator_client, small_model):
    url = f"/api/v1/model-profiles/{small_model.pk}/"
    for bad in (0, -5, "lots"):
        refused = operator_client.patch(url, {"max_model_len": bad}, format="json")
        assert refused.status_code == 400 and "max_model_len" in refused.json()["fields"], refused.json()
