"""A load generator for watching the autoscaler work: closed-loop clients in stages.

    python -m dataplane.loadgen --url http://127.0.0.1:8080 --key $KEY --model chat \\
        --stages 30x2,90x24,120x2 [--max-tokens 128] [--prompt-words 50]

Each stage is SECONDSxCLIENTS: that many clients each send a completion, wait for the answer,
and send the next, for that long. Every 5 s it prints what was sent and answered, errors by
status, and p50/p99 latency, so a newcomer sees replicas and latency move together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from dataplane.runtime.minihttp import request


def parse_stages(text: str) -> list[tuple[float, int]]:
    """'30x2,90x24' -> [(30.0, 2), (90.0, 24)]; refuses what it cannot read, naming it."""
    stages = []
    for part in text.split(","):
        seconds, sep, clients = part.strip().partition("x")
        try:
            stage = (float(seconds), int(clients))
        except ValueError:
            stage = (-1.0, -1)
        if not sep or stage[0] <= 0 or stage[1] < 0:
            raise ValueError(f"stage {part!r}: write SECONDSxCLIENTS, e.g. 30x4")
        stages.append(stage)
    return stages


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)

    def drain_into(self, total: Tally) -> None:
        """Add this period's counts to the total and start a new period."""
        total.sent, total.ok = total.sent + self.sent, total.ok + self.ok
        total.failed.update(self.failed)
        total.latencies += self.latencies
        self.sent, self.ok, self.failed, self.latencies = 0, 0, Counter(), []

    def line(self, elapsed: float, clients: int) -> str:
        lat = sorted(self.latencies)
        p50 = lat[len(lat) // 2] if lat else 0.0
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0.0
        errors = " ".join(f"{k}:{v}" for k, v in sorted(self.failed.items())) or "-"
        return (
            f"{elapsed:6.0f}s clients {clients:3d}  sent {self.sent:5d}  ok {self.ok:5d}"
            f"  errors {errors}  p50 {p50:6.2f}s  p99 {p99:6.2f}s"
        )


async def client(url: str, key: str, body: bytes, until: float, tally: Tally, timeout_s: float) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    while time.monotonic() < until:
        tally.sent += 1
        started = time.monotonic()
        try:
            answer = await request(
                "POST", host, port, "/v1/completions", body=body, headers=headers, timeout_s=timeout_s
            )
        except (OSError, TimeoutError) as exc:
            tally.failed[type(exc).__name__] += 1
            await asyncio.sleep(0.5)  # the router is away: do not spin
            continue
        if answer.status == 200:
            tally.ok += 1
            tally.latencies.append(time.monotonic() - started)
        else:
            tally.failed[str(answer.status)] += 1
            if answer.status in (429, 503):
                await asyncio.sleep(float(answer.headers.get("retry-after", "1")))


async def run(args: argparse.Namespace) -> Tally:
    body = json.dumps(
        {"model": args.model, "prompt": "hello " * args.prompt_words, "max_tokens": args.max_tokens}
    ).encode()
    total = Tally()
    start = time.monotonic()
    for seconds, clients in parse_stages(args.stages):
        until = time.monotonic() + seconds
        tally = Tally()
        tasks = [
            asyncio.create_task(client(args.url, args.key, body, until, tally, args.timeout))
            for _ in range(clients)
        ]
        while time.monotonic() < until:
            await asyncio.sleep(min(5.0, max(0.0, until - time.monotonic())))
            print(tally.line(time.monotonic() - start, clients), flush=True)
            tally.drain_into(total)
        await asyncio.gather(*tasks)
        tally.drain_into(total)
    print("total " + total.line(time.monotonic() - start, 0).strip(), flush=True)
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataplane.loadgen", description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the router")
    p.add_argument("--key", default=os.environ.get("MU_API_KEY"), help="a tenant's API key (or $MU_API_KEY)")
    p.add_argument("--model", required=True, help="the endpoint's name")
    p.add_argument("--stages", default="30x2,90x24,120x2", help="SECONDSxCLIENTS,... (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-words", type=int, default=50)
    p.add_argument("--timeout", type=float, default=60.0, help="one request, seconds")
    args = p.parse_args(argv)
    if not args.key:
        p.error("--key (or $MU_API_KEY) is required")
    try:
        parse_stages(args.stages)
    except ValueError as exc:
        p.error(str(exc))
    total = asyncio.run(run(args))
    return 0 if total.ok else 1


if __name__ == "__main__":
    sys.exit(main())
