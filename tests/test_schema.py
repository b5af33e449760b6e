"""The OpenAPI schema and its docs page, served without any CDN."""

import re

import httpx
from rest_framework.test import APIClient


def test_openapi_schema_describes_the_api(db):
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    for path in [
        "/api/v1/endpoints/",
        "/api/v1/endpoints/{id}/",
        "/api/v1/reservations/",
        "/api/v1/capacity/",
        "/api/v1/usage/",
    ]:
        assert path in schema["paths"], path
    usage = schema["paths"]["/api/v1/usage/"]["get"]
    assert {p["name"] for p in usage["parameters"]} >= {
        "granularity",
        "start",
        "end",
        "endpoint",
        "tenant",
        "page",
    }
    page = usage["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    row = schema["components"]["schemas"][page]["properties"]["results"]["items"]["$ref"].rsplit("/", 1)[-1]
    assert set(schema["components"]["schemas"][row]["properties"]) >= {
        "endpoint", "start", "end", "mu", "requests", "tokens_in", "tokens_out", "throttled", "errors",
    }  # fmt: skip
    assert schema["components"]["securitySchemes"]["bearerKey"]["scheme"] == "bearer"


def test_docs_page_loads_its_assets_locally(db):
    response = APIClient().get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources, html
    assert all(not s.startswith(("http://", "https://", "//")) for s in sources), sources


def test_every_operation_documents_its_errors_with_the_error_body(db):
    schema = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert set(schema["components"]["schemas"]["ApiError"]["required"]) == {"error", "detail"}
    error_ref = {"$ref": "#/components/schemas/ApiError"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            codes = {"400", "401", "403", "404"} | (
                {"409", "413", "415"} if method in ("post", "put", "patch", "delete") else set()
            )
            responses = operation["responses"]
            assert codes <= set(responses), (method, path, sorted(responses))
            for code in codes - {"409"}:  # some 409s are documented by their view, with more fields
                assert responses[code]["content"]["application/json"]["schema"] == error_ref, (
                    method,
                    path,
                    code,
                )
    event = schema["components"]["schemas"]["Event"]["properties"]["tenant"]
    assert event["nullable"] is True  # fleet-wide events belong to no tenant


def test_docs_page_answers_options_without_an_error(live_server):
    # The docs page renders HTML only: DRF's OPTIONS metadata has no template there, which was a
    # 500 with a traceback in the log for anyone's OPTIONS request.
    response = httpx.options(f"{live_server.url}/api/docs/", timeout=30)
    assert response.status_code in (200, 405), response.text
    assert httpx.get(f"{live_server.url}/api/docs/", timeout=30).status_code == 200
