"""controlplane.webserver.BoundedApp: at most app_concurrency requests inside the app at once,
each entering with its body already read; the rest wait."""

import asyncio

from controlplane.webserver import DEADLINES, BoundedApp


def test_requests_inside_the_app_are_bounded_and_each_enters_with_its_body():
    inside = 0
    most = 0
    bodies: list[bytes] = []

    async def app(scope, receive, send):
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        body = b""
        while True:  # as Django reads: everything is there already, no wait
            message = await asyncio.wait_for(receive(), timeout=0.01)
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await asyncio.sleep(0.01)
        bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        inside -= 1

    async def one(bounded, i):
        chunks = [b"part-%d-" % i, b"end"]

        async def receive():
            await asyncio.sleep(0.005)  # a body arriving slowly, outside the app
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

        async def send(message):
            pass

        await bounded({"type": "http"}, receive, send)

    async def main():
        bounded = BoundedApp(app)
        await asyncio.gather(*(one(bounded, i) for i in range(DEADLINES.app_concurrency * 3)))

    asyncio.run(main())
    assert most == DEADLINES.app_concurrency
    assert sorted(bodies) == sorted(b"part-%d-end" % i for i in range(DEADLINES.app_concurrency * 3))


def test_a_client_gone_before_its_body_is_in_never_enters():
    entered = []

    async def app(scope, receive, send):
        entered.append(scope)

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        pass

    asyncio.run(BoundedApp(app)({"type": "http"}, receive, send))
    assert entered == []


def test_bodies_read_ahead_of_a_slot_share_a_byte_budget(monkeypatch):
    """With room for one 2 MB body, the second request reads nothing until the first is done."""
    monkeypatch.setattr(DEADLINES, "prefetch_budget_bytes", 3 * 2**20)
    reads: list[str] = []
    release = asyncio.Event()

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/first":
            await release.wait()

    def client(name):
        chunks = [b"x" * 2**20, b"x" * 2**20]

        async def receive():
            reads.append(name)
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

        return receive

    async def send(message):
        pass

    async def main():
        bounded = BoundedApp(app, max_body_bytes=2_621_440)
        headers = [(b"content-length", str(2 * 2**20).encode())]
        first = asyncio.create_task(
            bounded({"type": "http", "path": "/first", "headers": headers}, client("first"), send)
        )
        second = asyncio.create_task(
            bounded({"type": "http", "path": "/second", "headers": headers}, client("second"), send)
        )
        await asyncio.sleep(0.05)
        assert reads == ["first", "first"]  # the second waits unread: no room for its 2 MB
        release.set()
        await asyncio.gather(first, second)
        assert reads == ["first", "first", "second", "second"]

    asyncio.run(main())


def test_a_declared_body_over_the_limit_gets_413_unread():
    sent: list[dict] = []

    async def app(scope, receive, send):
        raise AssertionError("never entered")

    async def receive():
        raise AssertionError("never read")

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/login/", "headers": [(b"content-length", b"10485760")]}
    asyncio.run(BoundedApp(app, max_body_bytes=2_621_440)(scope, receive, send))
    assert sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"]
