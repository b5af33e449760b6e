"""controlplane.webserver.OneHopHandler: Django's middleware chain and view run in one hop from
the event loop to the request's thread, answering as Django's own ASGI handler does."""

import asyncio
import re
from typing import Any

import pytest
from asgiref.sync import AsyncToSync, SyncToAsync
from django.core.handlers.asgi import ASGIHandler

from controlplane.webserver import OneHopHandler


def call(app: Any, method: str, path: str, body: bytes = b"") -> list[dict[str, Any]]:
    """One request through `app`, as uvicorn passes it; the messages it sent back."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    sent: list[dict[str, Any]] = []

    async def main() -> None:
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await asyncio.Event().wait()  # the client stays: Django cancels this wait once answered
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)

    asyncio.run(main())
    return sent


def answer(sent: list[dict[str, Any]]) -> tuple[int, dict[bytes, bytes], bytes]:
    """Status, headers and body, less what differs on every answer (the CSRF cookie and token)."""
    start = sent[0]
    headers = {k.lower(): v for k, v in start["headers"] if k.lower() != b"set-cookie"}
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], headers, re.sub(rb'"X-CSRFToken": "\w+"', b"", body)


@pytest.fixture
def closed_after_each_request(transactional_db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request's database connection closed when it ends, as the production server's are
    (controlplane/asgi.py): the request's thread ends with it."""
    from django.db import connections

    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often a request crossed from the event loop to a thread and back."""
    counted = {"to_thread": 0, "to_loop": 0}
    to_thread, to_loop = SyncToAsync.__call__, AsyncToSync.__call__

    async def counting_to_thread(self: SyncToAsync[Any, Any], *args: Any, **kwargs: Any) -> Any:
        counted["to_thread"] += 1
        return await to_thread(self, *args, **kwargs)

    def counting_to_loop(self: AsyncToSync[Any, Any], *args: Any, **kwargs: Any) -> Any:
        counted["to_loop"] += 1
        return to_loop(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counting_to_thread)
    monkeypatch.setattr(AsyncToSync, "__call__", counting_to_loop)
    return counted


REQUESTS = [
    ("GET", "/api/v1/endpoints/", b""),  # the API without a key: 401, JSON
    ("POST", "/api/v1/reservations/", b'{"endpoint": 1}'),
    ("GET", "/no-such-page/", b""),  # the console's 404
    ("GET", "/console/", b""),  # the sign-in redirect
]


@pytest.mark.parametrize("method,path,body", REQUESTS)
def test_a_request_crosses_to_its_thread_once_and_is_answered_as_by_django(
    closed_after_each_request: None, hops: dict[str, int], method: str, path: str, body: bytes
) -> None:
    ours = call(OneHopHandler(), method, path, body)
    # request_started, the chain and the view, the response's close: each once, to one thread
    assert hops == {"to_thread": 3, "to_loop": 0}, hops
    djangos = call(ASGIHandler(), method, path, body)
    status, headers, content = answer(ours)
    assert status in (302, 401, 404)
    assert (status, headers, content) == answer(djangos)


def test_djangos_own_handler_crosses_back_and_forth(
    closed_after_each_request: None, hops: dict[str, int]
) -> None:
    """What the count above tells apart: the chain as Django builds it for ASGI."""
    call(ASGIHandler(), "GET", "/api/v1/endpoints/")
    assert hops["to_loop"] >= 1 and hops["to_thread"] > 3, hops
