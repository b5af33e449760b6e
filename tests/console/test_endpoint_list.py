"""The console's endpoint list pages newest first through older/newer links (a cursor, not a
page number), keeps the filters in them, says how many match up to a bound, and shows each
viewer only what it may see, whatever the link it follows."""

import re

import pytest

from controlplane.console.views import endpoints as view


@pytest.fixture
def pages_of_two(monkeypatch):
    monkeypatch.setattr(view, "PAGE_SIZE", 2)


def shown(html: str) -> list[str]:
    return re.findall(r'<tr data-endpoint="([^"]+)">', html)


def link(html: str, label: str) -> str | None:
    found = re.search(rf'<a href="(\?[^"]*)"[^>]*>{label}</a>', html)
    return found.group(1).replace("&amp;", "&") if found else None


def walk(client, url: str, label: str) -> list[list[str]]:
    pages = []
    while url:
        response = client.get(f"/console/endpoints/{url}")
        assert response.status_code == 200, response.content[:300]
        html = response.content.decode()
        pages.append(shown(html))
        url = link(html, label)
    return pages


def test_older_and_newer_links_walk_every_endpoint_once(operator_web, owner, make_endpoint, pages_of_two):
    for i in range(5):
        make_endpoint(owner, f"e{i}")
    pages = walk(operator_web, "?", "older →")
    assert pages == [["e4", "e3"], ["e2", "e1"], ["e0"]]
    last = operator_web.get("/console/endpoints/?after=" + str(owner.endpoints.get(name="e1").pk))
    assert shown(last.content.decode()) == ["e0"] and link(last.content.decode(), "older →") is None
    back = walk(operator_web, link(last.content.decode(), "← newer"), "← newer")
    assert back == [["e2", "e1"], ["e4", "e3"]]


def test_the_links_keep_the_filters_and_the_count_stops_at_its_bound(
    owner_web, owner, make_endpoint, pages_of_two, monkeypatch
):
    for i in range(6):
        make_endpoint(owner, f"chat-{i}" if i % 2 else f"batch-{i}")
    html = owner_web.get("/console/endpoints/?search=chat").content.decode()
    assert shown(html) == ["chat-5", "chat-3"] and "3 endpoints, newest first" in html
    older = link(html, "older →")
    assert "search=chat" in older and "page=" not in older
    assert walk(owner_web, older, "older →") == [["chat-1"]]
    monkeypatch.setattr(view, "COUNT_UP_TO", 4)
    assert "more than 4 endpoints" in owner_web.get("/console/endpoints/").content.decode()


def test_a_tenant_following_any_link_sees_only_its_own(
    operator_web, owner_web, owner, other, make_endpoint, pages_of_two
):
    for i in range(3):
        make_endpoint(owner, f"mine-{i}")
        make_endpoint(other, f"theirs-{i}")
    operator_older = link(operator_web.get("/console/endpoints/").content.decode(), "older →")
    pages = walk(owner_web, operator_older, "older →")
    assert pages == [["mine-1", "mine-0"]]  # what is older than the operator's page, its own only
    html = owner_web.get("/console/endpoints/").content.decode()
    assert "theirs" not in html and "3 endpoints" in html


def test_a_bad_cursor_is_a_400_naming_it(owner_web, owner, make_endpoint):
    make_endpoint(owner, "chat")
    response = owner_web.get("/console/endpoints/?after=nine")
    assert response.status_code == 400 and "after:" in response.content.decode()
    assert "chat" not in shown(response.content.decode())
