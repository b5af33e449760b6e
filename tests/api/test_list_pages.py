"""The lists that grow with the fleet page through a cursor: newest first, `next` and
`previous` links that never miss nor repeat a row while rows come and go, no count; ?page=N as
before for the clients written against it; each a tenant's own rows only, whatever the cursor."""

import pytest

from controlplane.endpoints.models import Pod
from controlplane.selling import delete_endpoint


def walk(client, url: str, link: str = "next") -> tuple[list[str], list[dict]]:
    """Every row's name from `url` on, following `link`; with the pages as answered."""
    names, pages = [], []
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.content
        page = response.json()
        assert "count" not in page  # a cursor's pages count nothing
        pages.append(page)
        names += [row.get("name") or row["endpoint"] for row in page["results"]]
        url = page[link]
    return names, pages


def test_a_cursor_walks_every_endpoint_newest_first_and_back(operator_client, owner, other, make_endpoint):
    made = [make_endpoint(owner if i % 2 else other, f"e{i}").name for i in range(7)]
    names, pages = walk(operator_client, "/api/v1/endpoints/?page_size=3")
    assert names == made[::-1] and len(pages) == 3
    assert pages[0]["previous"] is None and pages[-1]["next"] is None
    back, _ = walk(operator_client, pages[-1]["previous"], link="previous")
    assert back == ["e3", "e2", "e1", "e6", "e5", "e4"]  # the pages before the last, each newest first


def test_rows_that_come_and_go_between_pages_are_neither_missed_nor_repeated(
    operator_client, owner, make_endpoint
):
    made = [make_endpoint(owner, f"e{i}") for i in range(6)]
    first = operator_client.get("/api/v1/endpoints/?page_size=2").json()
    assert [e["name"] for e in first["results"]] == ["e5", "e4"]
    make_endpoint(owner, "newer")  # lands before the cursor: the next page does not shift
    delete_endpoint(made[3])  # the next page's first row goes
    rest, _ = walk(operator_client, first["next"])
    assert rest == ["e2", "e1", "e0"]


def test_the_first_page_back_is_full_when_rows_were_added(operator_client, owner, make_endpoint):
    for i in range(5):
        make_endpoint(owner, f"e{i}")
    second = operator_client.get(operator_client.get("/api/v1/endpoints/?page_size=2").json()["next"]).json()
    make_endpoint(owner, "e5")
    back = operator_client.get(second["previous"]).json()
    assert [e["name"] for e in back["results"]] == ["e4", "e3"] and back["previous"]
    newest = operator_client.get(back["previous"]).json()  # one row newer is left: the newest page
    assert [e["name"] for e in newest["results"]] == ["e5", "e4"] and newest["previous"] is None


def test_a_tenant_following_any_cursor_sees_only_its_own(
    operator_client, owner_client, owner, other, make_endpoint
):
    for i in range(4):
        make_endpoint(owner, f"mine-{i}")
        make_endpoint(other, f"theirs-{i}")
    operator_page = operator_client.get("/api/v1/endpoints/?page_size=1").json()
    names, _ = walk(owner_client, operator_page["next"])  # a cursor made for the operator
    assert names == [f"mine-{i}" for i in reversed(range(4))]


def test_a_cursor_keeps_the_filters_and_the_search(operator_client, owner, make_endpoint):
    for i in range(6):
        make_endpoint(owner, f"chat-{i}" if i % 2 else f"batch-{i}")
    names, pages = walk(operator_client, "/api/v1/endpoints/?search=CHAT&page_size=2")
    assert names == ["chat-5", "chat-3", "chat-1"] and len(pages) == 2
    short, _ = walk(operator_client, "/api/v1/endpoints/?search=-&page_size=1")  # no trigram: a scan
    assert short == ["chat-5", "batch-4", "chat-3", "batch-2", "chat-1", "batch-0"]


@pytest.mark.parametrize("path", ["/api/v1/pods/", "/api/v1/reservations/"])
def test_pods_and_reservations_page_through_a_cursor_too(operator_client, owner, grow_tenant, path):
    grow_tenant(owner, 5)
    names, pages = walk(operator_client, f"{path}?page_size=2")
    assert len(names) == 5 and len(set(names)) == 5 and len(pages) == 3
    numbered = operator_client.get(f"{path}?page=2&page_size=2").json()
    assert numbered["count"] == 5 and len(numbered["results"]) == 2


def test_the_tenants_pods_only(owner_client, owner, other, grow_tenant):
    grow_tenant(owner, 2)
    grow_tenant(other, 3)
    names, _ = walk(owner_client, "/api/v1/pods/?page_size=1")
    assert sorted(names) == ["owner-pod-0", "owner-pod-1"] and Pod.objects.count() == 5


def test_every_numbered_page_is_its_slice_of_the_list_from_either_end(
    operator_client, owner_client, owner, other, make_endpoint, grow_tenant
):
    """A page nearer the end is read from the end: each page of each size, the operator's, a
    filtered one, a tenant's (by key, newest first) and the pods' (by endpoint and name), is
    the same slice of the whole list."""
    for i in range(7):
        make_endpoint(owner if i % 3 else other, f"e{i}")
    grow_tenant(owner, 3)
    for client, path, query in [
        (operator_client, "/api/v1/endpoints/", {}),
        (operator_client, "/api/v1/endpoints/", {"tenant": "owner"}),
        (owner_client, "/api/v1/endpoints/", {}),
        (operator_client, "/api/v1/pods/", {}),
    ]:
        whole = client.get(path, {**query, "page": 1, "page_size": 100}).json()
        every = [row["id"] for row in whole["results"]]
        assert whole["count"] == len(every) >= 3
        for size in range(1, len(every) + 1):
            for number in range(1, -(-len(every) // size) + 1):
                page = client.get(path, {**query, "page": number, "page_size": size}).json()
                assert [row["id"] for row in page["results"]] == every[(number - 1) * size : number * size]
                assert page["count"] == len(every)
