"""Every answer under /api/ is JSON `{"error": code, "detail": text}`, and nothing a client sends
is a 500: unknown paths, ids the URL refuses, big bodies, NUL characters, deep nesting, unique
races, odd router samples. On the test database (PostgreSQL in `make test`; SQLite takes the
same bodies, refused by the same parser before any database sees them)."""

import json

import pytest
from django.db import IntegrityError, transaction
from django.test import Client

from controlplane.api import views
from controlplane.api.errors import exception_handler
from controlplane.api.parsers import body_problem
from controlplane.endpoints.models import Endpoint
from controlplane.tenants.models import Tenant
from dataplane.wire.load_samples import MAX_SECOND
from tests.conftest import endpoint_body

NUL_ERROR = "must not contain a NUL (\\u0000) character"


def assert_api_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert body["error"] == code and isinstance(body["detail"], str), body
    return body


def post_raw(client, path: str, raw: bytes | str):
    return client.post(path, raw, content_type="application/json")


@pytest.mark.parametrize(
    "path",
    ["/api/v1/nope/", "/api/v1/capacity/abc/", "/api/v1/endpoints/abc/", "/api/v1/endpoints/1/nope/"],
)
def test_unknown_paths_and_ids_the_url_refuses_are_json_404s(owner_client, operator_client, path):
    client = operator_client if "capacity" in path else owner_client
    assert_api_error(client.get(path), 404, "not_found")


def test_a_missing_trailing_slash_redirects_in_json(owner_client):
    response = owner_client.get("/api/v1/endpoints")
    assert response.status_code == 301 and response["Location"] == "/api/v1/endpoints/"
    assert response.json()["error"] == "moved"


def test_a_body_over_the_upload_limit_is_a_json_413(settings, owner_client):
    big = json.dumps({"name": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)})
    assert_api_error(post_raw(owner_client, "/api/v1/endpoints/", big), 413, "too_large")


def test_a_bug_under_the_api_is_a_json_500_without_its_text(monkeypatch, operator_client):
    def broken():
        raise RuntimeError('relation "secret_table" does not exist')

    monkeypatch.setattr(views, "routing_table", broken)
    client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {operator_client.secret}")
    body = assert_api_error(client.get("/api/v1/routing-table/"), 500, "internal")
    assert "secret_table" not in json.dumps(body) and "Traceback" not in json.dumps(body)


def test_a_bad_host_under_the_api_is_json(owner_client):
    assert_api_error(owner_client.get("/api/v1/endpoints/", HTTP_HOST="evil"), 400, "bad_request")


# --- NUL characters: PostgreSQL text cannot hold them; one parser refuses them, naming the field


@pytest.mark.parametrize("field", ["pool", "tenant", "name", "model"])
def test_a_nul_in_an_endpoint_field_is_a_400_naming_it(owner_client, pool, small_model, field):
    body = endpoint_body(**{field: "a\u0000b"})
    answer = assert_api_error(owner_client.post("/api/v1/endpoints/", body, format="json"), 400, "invalid")
    assert answer["fields"] == {field: {"errors": [NUL_ERROR]}}
    assert not Endpoint.objects.exists()


@pytest.mark.parametrize("field", ["tenant", "name"])
def test_a_nul_in_an_api_key_field_is_a_400_naming_it(owner_client, operator_client, owner, field):
    body = {"name": "k", "tenant": "owner", field: "own\u0000er"}
    for client in (owner_client, operator_client):
        answer = client.post("/api/v1/api-keys/", body, format="json")
        assert assert_api_error(answer, 400, "invalid")["fields"] == {field: {"errors": [NUL_ERROR]}}


def test_a_nul_deep_in_an_event_detail_or_in_a_key_is_a_400(operator_client, owner):
    body = {"kind": "hang", "message": "m", "detail": {"probes": [{"note": "x\u0000"}]}}
    answer = assert_api_error(operator_client.post("/api/v1/events/", body, format="json"), 400, "invalid")
    assert answer["fields"] == {"detail.probes[0].note": {"errors": [NUL_ERROR]}}
    body = {"kind": "hang", "message": "m", "detail": {"a\u0000": 1}}
    answer = assert_api_error(operator_client.post("/api/v1/events/", body, format="json"), 400, "invalid")
    assert list(answer["fields"]) == ["detail"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/capacity/?gpu_type=%00",
        "/api/v1/events/?tenant=a%00",
        "/api/v1/endpoints/?search=%00",
        "/api/v1/endpoints/?pool=x%00y",
        "/api/v1/tenants/?name=%00",
    ],
)
def test_a_nul_in_a_query_parameter_is_a_400_naming_it(operator_client, path):
    name = path.split("?")[1].split("=")[0]
    answer = assert_api_error(operator_client.get(path), 400, "invalid")
    assert answer["fields"] == {name: {"errors": [NUL_ERROR]}}


# --- nesting: refused past API_MAX_JSON_DEPTH, and a pathological depth never reaches recursion


def test_a_body_nested_fifty_thousand_levels_is_a_400(owner_client):
    deep = "[" * 50_000 + "]" * 50_000
    answer = assert_api_error(post_raw(owner_client, "/api/v1/endpoints/", deep), 400, "parse_error")
    assert "nested deeper than 64 levels" in answer["detail"]


def test_a_body_one_level_past_the_limit_is_a_400_naming_its_field(settings, owner_client):
    settings.API_MAX_JSON_DEPTH = 8
    ok = endpoint_body(autoscaler={"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}})  # 7 levels in all
    assert body_problem(ok, 8) is None
    deep = endpoint_body(autoscaler={"a": {"b": {"c": {"d": {"e": {"f": {"g": [1]}}}}}}})  # 9
    answer = assert_api_error(owner_client.post("/api/v1/endpoints/", deep, format="json"), 400, "invalid")
    assert answer["fields"] == {"autoscaler": {"errors": ["the JSON body is nested deeper than 8 levels"]}}


def test_the_body_check_is_iterative_and_finds_non_finite_numbers():
    doc: list = []
    inner = doc
    for _ in range(20_000):  # far past Python's recursion limit
        inner.append([])
        inner = inner[0]
    assert body_problem(doc, 10**6) is None
    assert body_problem(doc, 64) == ("", "the JSON body is nested deeper than 64 levels")
    assert body_problem({"rows": [{"mu": float("inf")}]}, 64) == (
        "rows[0].mu",
        "must be a finite number, got inf",
    )


# --- unique races: a 409 naming the resource and field, never the database's text


def test_a_unique_race_is_a_409_naming_the_field_without_database_text(owner, make_endpoint):
    make_endpoint(owner, "chat")
    for model, dup in [
        (Tenant, lambda: Tenant.objects.create(name="owner")),
        (Endpoint, lambda: make_endpoint(owner, "chat")),
    ]:
        with pytest.raises(IntegrityError) as caught, transaction.atomic():
            dup()  # what the loser of two concurrent creates hits, past the serializer's check
        with transaction.atomic():  # the handler rolls back the request's transaction: this one
            response = exception_handler(caught.value, {})
        assert response.status_code == 409
        text = json.dumps(response.data)
        for leak in ("duplicate", "constraint", "UNIQUE", "Key (", "_uniq", "tenants_tenant"):
            assert leak not in text, (model, text)
        assert response.data["error"] == "conflict"
        expected = ["name"] if model is Tenant else ["tenant", "name"]
        assert list(response.data["fields"]) == expected, response.data
        assert model._meta.verbose_name in response.data["detail"]


# --- /load-samples/ (operators: the routers' keys): odd values are 400s naming the field


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"router": "router-a", "second": 2**63, "rows": []}, "second", "unix second"),
        ({"router": "router-a", "second": MAX_SECOND + 1, "rows": []}, "second", "unix second"),
        (
            {"router": "router-a", "second": 5, "rows": [{"endpoint": 2**31, "tenant": "a"}]},
            "rows",
            "rows[0].endpoint",
        ),
        (
            {"router": "router-a", "second": 5, "rows": [{"endpoint": 1, "tenant": "a", "mu": 4e23}]},
            "rows",
            "rows[0].mu",
        ),
        (
            {"router": "router-a", "second": 5, "rows": [{"endpoint": 1, "tenant": "a", "mu": -1}]},
            "rows",
            "rows[0].mu",
        ),
        (
            {"router": "router-a", "second": 5, "rows": [{"endpoint": 1, "tenant": "a", "requests": 2**63}]},
            "rows",
            "rows[0].requests",
        ),
        (
            {"router": "router-a", "second": 5, "rows": [{"endpoint": 1, "tenant": "a" * 64}]},
            "rows",
            "rows[0].tenant",
        ),
        (
            {"router": "router-a", "second": 5, "rows": [{"endpoint": 1, "tenant": "a\u0000"}]},
            "rows[0].tenant",
            "NUL",
        ),
        # the router's id is the idempotency key: one that is missing or not an id is refused
        ({"second": 5, "rows": []}, "router", "must be a router id"),
        ({"router": "../../etc", "second": 5, "rows": []}, "router", "must be a router id"),
        ({"router": "r" * 81, "second": 5, "rows": []}, "router", "must be a router id"),
    ],
)
def test_odd_router_samples_are_400s_naming_the_field(operator_client, body, field, says):
    answer = assert_api_error(
        operator_client.post("/api/v1/load-samples/", body, format="json"), 400, "invalid"
    )
    assert says in " ".join(answer["fields"][field]["errors"]), answer


def test_non_finite_and_non_object_samples_are_400s(operator_client):
    inf = '{"second": 5, "rows": [{"endpoint": 1, "tenant": "a", "inflight": 1e400}]}'
    answer = assert_api_error(post_raw(operator_client, "/api/v1/load-samples/", inf), 400, "invalid")
    assert answer["fields"] == {"rows[0].inflight": {"errors": ["must be a finite number, got inf"]}}
    assert_api_error(post_raw(operator_client, "/api/v1/load-samples/", "[1, 2]"), 400, "invalid")


def test_a_malformed_page_size_is_a_400_not_the_default(owner_client, operator_client):
    for value in ("0.5", "-1", "0", "x"):
        answer = assert_api_error(owner_client.get(f"/api/v1/endpoints/?page_size={value}"), 400, "invalid")
        assert list(answer["fields"]) == ["page_size"]
        assert_api_error(operator_client.get(f"/api/v1/events/?page_size={value}"), 400, "invalid")
    assert owner_client.get("/api/v1/endpoints/?page_size=100000").status_code == 200  # capped at 500
