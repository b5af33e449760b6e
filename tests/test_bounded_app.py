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
