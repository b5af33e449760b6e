"""Nothing a request sends comes back unescaped from any console page or fragment, and every
page carries the Content-Security-Policy.

Every URL pattern of the console (and the sign-in page) is requested with every parameter the
console reads set to markup, as a page and as an htmx fragment, by GET and by POST, as an
operator and as a tenant: a new view is covered by being routed, a new parameter by being read
(``PARAMETERS`` is checked against the names the views' source reads).
"""

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, reverse

from controlplane.api.filters import EndpointFilterSet, EventFilterSet, EventGroupFilterSet
from controlplane.console import urls as console_urls
from controlplane.console.views import endpoints as endpoint_views
from controlplane.oncall.models import Event
from controlplane.tenants.models import Member

# An attribute breaker, a tag that runs on load, a script block; escaped, none is markup.
PAYLOAD = "\"'><img src=x onerror=alert(1)><script>alert('xss')</script>"
RAW = ("<img src=x", "<script>alert")
VIEWS = Path(endpoint_views.__file__).parent

PARAMETERS = sorted(
    {
        *EndpointFilterSet.base_filters,
        *EventFilterSet.base_filters,
        *EventGroupFilterSet.base_filters,
        "view",
        "minutes",
        "reason",
        *endpoint_views.ENDPOINT_FIELDS,
        "after",
        "window",
        "page",
        "endpoint",
        "mu_per_minute",
        "best_effort_allowed",
        "scale_to_zero_enabled",
        "tenant",
        "next",
        "username",
        "password",
        PAYLOAD,  # a hostile name too
    }
)


def read_by_views() -> set[str]:
    """The parameter names the console's views read by name (request.GET/POST.get("...") )."""
    names: set[str] = set()
    for source in VIEWS.glob("*.py"):
        names |= set(
            re.findall(r"request\.(?:GET|POST)\.get(?:list)?\(\s*[\"'](\w+)[\"']", source.read_text())
        )
    return names


def test_the_hostile_parameters_cover_every_name_the_views_read():
    assert read_by_views() - set(PARAMETERS) == set()


def routes() -> list[tuple[str, dict[str, str]]]:
    """(URL name, which object its pk is) of every console pattern."""
    out = []
    for pattern in console_urls.urlpatterns:
        assert isinstance(pattern, URLPattern)
        name = f"console:{pattern.name}"
        kind = (
            "pool"
            if "pools" in str(pattern.pattern)
            else "profile"
            if "profile" in str(pattern.pattern)
            else "event"
            if "event" in str(pattern.pattern)
            else "group"
            if "groups" in str(pattern.pattern)
            else "endpoint"
        )
        params = {"pk": kind} if "<int:pk>" in str(pattern.pattern) else {}
        if "<slug:kind>" in str(pattern.pattern):
            params["kind"] = "kind"
        out.append((name, params))
    return out


@pytest.fixture
def hostile_fleet(owner, make_endpoint, small_model):
    endpoint = make_endpoint(owner, "chat")
    event = Event.record("hang", "a hang", endpoint=endpoint, severity="critical", pod="chat-0")
    return {
        "endpoint": endpoint.pk,
        "pool": endpoint.pool_id,
        "event": event.pk,
        "group": event.group_id,
        "profile": small_model.pk,
        "kind": "hang",
    }


def client_for(username: str, **member) -> Client:
    user = User.objects.create_user(username)
    Member.objects.create(user=user, **member)
    client = Client()
    client.force_login(user)
    return client


def assert_escaped(response, what: str) -> None:
    assert response.status_code < 500, what
    body = response.content.decode()
    if response.status_code in (403, 404) and response.get("Content-Type", "").startswith("text/html"):
        # A refusal is one of the console's pages (styled, with its icon), not Django's bare one.
        assert "console/console.css" in body and 'rel="icon"' in body, (
            f"{what}: a bare {response.status_code}"
        )
    for raw in RAW:
        assert raw not in body, f"{what}: {raw!r} came back unescaped"
    policy = response.get("Content-Security-Policy", "")
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy, what


@pytest.mark.parametrize(("route", "pk_of"), routes(), ids=[r[0] for r in routes()])
def test_no_console_view_echoes_a_request_unescaped(route, pk_of, hostile_fleet, owner):
    kwargs = {name: hostile_fleet[kind] for name, kind in pk_of.items()}
    url = reverse(route, kwargs=kwargs)
    data = dict.fromkeys(PARAMETERS, PAYLOAD)
    for who, client in [
        ("operator", client_for("opal", is_operator=True)),
        ("tenant", client_for("olivia", tenant=owner)),
    ]:
        for htmx in ({}, {"HX-Request": "true"}):
            assert_escaped(client.get(url, data, headers=htmx), f"GET {url} as {who} {htmx}")
            assert_escaped(client.post(url, data, headers=htmx), f"POST {url} as {who} {htmx}")


def test_the_sign_in_and_locked_out_pages_escape_what_they_echo(db):
    client = Client()
    data = dict.fromkeys(PARAMETERS, PAYLOAD)
    assert_escaped(client.get("/accounts/login/", data), "GET sign-in")
    signed_in = client_for("pat", is_operator=True)
    for path in ("/accounts/password_change/", "/accounts/password_change/done/"):
        assert_escaped(signed_in.get(path, data), f"GET {path}")
        assert_escaped(signed_in.post(path, data), f"POST {path}")
    assert_escaped(client.post("/accounts/login/", data), "POST sign-in")
    for _ in range(12):  # past the lock-out: the locked-out page names the username sent
        response = client.post("/accounts/login/", {"username": PAYLOAD, "password": "wrong"})
    assert response.status_code == 429
    assert_escaped(response, "locked-out page")
    # Operators see the locked username on the on-call page, escaped too.
    oncall = client_for("opal", is_operator=True).get("/console/oncall/")
    assert "Sign-ins locked" in oncall.content.decode()
    assert_escaped(oncall, "on-call page naming the locked username")


def test_the_csrf_failure_page_is_one_of_ours_under_the_policy(owner):
    """Django's own CSRF failure page carries an inline <style>, which the policy refuses."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_user("csrf-less"))
    response = client.post("/accounts/logout/")
    assert response.status_code == 403
    assert "<style" not in response.content.decode()
    assert "CSRF check failed" in response.content.decode()
    assert_escaped(response, "CSRF failure page")


TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


@pytest.mark.parametrize("template", sorted(TEMPLATES.rglob("*.html")), ids=lambda p: p.name)
def test_no_template_has_inline_script_style_or_event_handler(template):
    """What the policy would refuse (and so break the page): <script> without src, <style>,
    style="..." and on*="..." attributes. Behaviour goes in static JS, looks in console.css."""
    text = template.read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), "inline <script>"
    assert "<style" not in text, "inline <style>"
    assert not re.search(r"\sstyle\s*=", text), "style attribute"
    assert not re.search(r"\son[a-z]+\s*=", text), "on* event handler attribute"
    assert "hx-on" not in text and "javascript:" not in text, "script in an attribute"


def test_a_tenant_refused_a_page_gets_the_consoles_403(owner):
    response = client_for("olivia", tenant=owner).get("/console/capacity/")
    body = response.content.decode()
    assert response.status_code == 403 and "only operators may see this page" in body
    assert "console/console.css" in body and "Back to the console" in body


def test_the_api_root_lists_its_collections_as_json(db):
    response = Client().get("/api/v1/")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    links = response.json()["links"]
    for name in ("endpoints", "pools", "capacity", "events", "usage", "whoami", "docs"):
        assert links[name].startswith("http://testserver/"), name
    for url in links.values():  # every link is routed (a 401 without a key, never a 404)
        assert Client().get(url).status_code != 404, url


def test_the_favicon_is_a_static_file(db):
    response = Client().get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("/console/favicon.svg")
