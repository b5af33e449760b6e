"""A model profile's context length (``max_model_len``): set through the API, and served in the
routing table as the context the endpoint's pods serve (the profile's, or less where their engine
serves less), where the routers bound an output budget and a prompt by it."""

from capacity.units import DEFAULT_MAX_MODEL_LEN
from controlplane.capacity.models import ModelProfile
from controlplane.endpoints.deployments import max_model_len_arg
from controlplane.endpoints.models import Rollout
from controlplane.endpoints.routing import routing_table


def test_the_routing_table_carries_the_context_the_pods_serve(
    operator_client, owner, make_endpoint, small_model
):
    """The simulated h100-llama-8b serves 8,192 tokens (as deployed with --max-model-len 8192):
    a profile that says nothing (1,048,576) or more routes at that; one that says less, at its
    own. Text is counted at the simulated tokenizer's 4 bytes a token at most."""
    make_endpoint(owner, "chat")
    url = f"/api/v1/model-profiles/{small_model.pk}/"
    assert operator_client.get(url).json()["max_model_len"] == DEFAULT_MAX_MODEL_LEN
    routed = routing_table().endpoints[0]
    assert (routed.max_model_len, routed.max_token_bytes) == (8192, 4)
    for said, served in ((131_072, 8192), (4096, 4096)):
        changed = operator_client.patch(url, {"max_model_len": said}, format="json")
        assert changed.status_code == 200 and changed.json()["max_model_len"] == said
        assert routing_table().endpoints[0].max_model_len == served


def test_a_vllm_deployment_routes_at_its_max_model_len_argument(settings, owner, make_endpoint, small_model):
    """vLLM pods: their --max-model-len (within the profile's), else the profile's (the model's
    own context, which only the profile says); their tokenizer is not known to the router."""
    settings.ENDPOINT_POD_ENGINE = "vllm"
    make_endpoint(owner, "chat")
    routed = routing_table().endpoints[0]
    assert (routed.max_model_len, routed.max_token_bytes) == (DEFAULT_MAX_MODEL_LEN, 0)
    settings.ENDPOINT_VLLM_ARGS = "--max-num-seqs 64 -- --max-model-len 16K"
    assert routing_table().endpoints[0].max_model_len == 16_384
    small_model.max_model_len = 8192
    small_model.save()
    assert routing_table().endpoints[0].max_model_len == 8192


def test_vllm_max_model_len_spellings():
    assert max_model_len_arg(("--max-model-len", "8192")) == 8192
    assert max_model_len_arg(("--max_model_len=8k",)) == 8000
    assert max_model_len_arg(("--max-model-len", "8K")) == 8192
    assert max_model_len_arg(("--max-model-len=1k", "--", "--max-model-len", "2k")) == 2000  # the last
    assert max_model_len_arg(("--max-model-len", "25.6k")) == 25_600
    assert max_model_len_arg(("--max-model-len", "auto")) is None
    assert max_model_len_arg(("--max-model-len", "-1")) is None
    assert max_model_len_arg(("--max-num-seqs", "8")) is None
    assert max_model_len_arg(("--max-model-len",)) is None


def test_during_a_rollout_the_routing_table_carries_the_larger_context(
    owner_client, owner, make_endpoint, h100
):
    """Either version may serve a request: the router refuses only what both would."""
    chat = make_endpoint(owner, "chat")
    ModelProfile.objects.create(
        model="tiny", gpu_type=h100, alpha=0, beta=0.004, gamma=0, simulated_profile="tiny-test"
    )
    assert (
        owner_client.patch(f"/api/v1/endpoints/{chat.pk}/", {"model": "tiny"}, format="json").status_code
        == 200
    )
    chat.refresh_from_db()
    assert chat.profile.model == "tiny" and Rollout.objects.active().filter(endpoint=chat).exists()
    assert routing_table().endpoints[0].max_model_len == 8192  # tiny-test's 512, h100-llama-8b's 8,192
    Rollout.objects.update(phase="done")
    assert routing_table().endpoints[0].max_model_len == 512  # the new version's alone


def test_a_context_length_below_one_token_is_refused_naming_it(operator_client, small_model):
    url = f"/api/v1/model-profiles/{small_model.pk}/"
    for bad in (0, -5, "lots"):
        refused = operator_client.patch(url, {"max_model_len": bad}, format="json")
        assert refused.status_code == 400 and "max_model_len" in refused.json()["fields"], refused.json()
