"""``python -m dataplane.loadgen``: drive completions through the router and print how they fared.

    MU_API_KEY=$KEY python -m dataplane.loadgen --url http://127.0.0.1:8080 --model chat \\
        [--stages 30x2,90x24,120x2] [--max-tokens 128] [--prompt-words 50] [--no-stream]
    python -m dataplane.loadgen --url ... --key-file var/keys/acme.key --model chat \\
        --trace azure-llm-2023-conv.csv [--rate-multiple 2] [--duration 300] [--max-concurrency 256]

Stages (closed loop): each stage is SECONDSxCLIENTS, that many clients each sending a
completion, reading the whole answer and sending the next, for that long. A trace (open loop)
sends each of its requests at its timestamp / the rate multiple, sized as the trace says
(``dataplane.loadgen.trace``). Requests stream (SSE, with the usage chunk) unless
``--no-stream``. Every 5 s, and as a total at the end, it prints requests sent, answered and
failed by status, requests and output tokens per second, and p50/p99 of end to end, time to
first token and inter-token latency, so a newcomer sees replicas and latency move together.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from urllib.parse import urlsplit

from dataplane.keys import add_key_arguments, read_key
from dataplane.loadgen.run import (
    Progress,
    completion_body,
    open_client,
    replay,
    report,
    run_stages,
    unreachable,
)
from dataplane.loadgen.trace import MAX_TOKENS, TraceError, TraceRequest, decoded, read_trace, schedule

PROG = "python -m dataplane.loadgen"
MAX_CONCURRENCY = 10_000  # requests in flight, each a connection: far past one process's file limit


def parse_stages(text: str) -> list[tuple[float, int]]:
    """'30x2,90x24' -> [(30.0, 2), (90.0, 24)]; refuses what it cannot read, naming it."""
    stages = []
    for part in text.split(","):
        seconds, sep, clients = part.strip().partition("x")
        try:
            stage = (float(seconds), int(clients))
        except ValueError:
            stage = (-1.0, -1)
        if not sep or not (math.isfinite(stage[0]) and stage[0] > 0) or not 0 <= stage[1] <= MAX_CONCURRENCY:
            raise ValueError(f"stage {part!r}: write SECONDSxCLIENTS, e.g. 30x4")
        stages.append(stage)
    return stages


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the router")
    add_key_arguments(p, "--key", "MU_API_KEY", "tenant's API key")
    p.add_argument("--model", required=True, help="the endpoint's name")
    p.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stream the answers (default; --no-stream: whole JSON answers, no TTFT or ITL)",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="one request, seconds")
    closed = p.add_argument_group("closed loop (without --trace)")
    closed.add_argument(
        "--stages", default="30x2,90x24,120x2", help="SECONDSxCLIENTS,... (default %(default)s)"
    )
    closed.add_argument("--max-tokens", type=int, default=128, help="each request's max_tokens")
    closed.add_argument("--prompt-words", type=int, default=50, help="words in each prompt")
    opened = p.add_argument_group("open loop")
    opened.add_argument("--trace", help="a CSV of TIMESTAMP,ContextTokens,GeneratedTokens to replay")
    opened.add_argument("--rate-multiple", type=float, default=1.0, help="replay this many times faster")
    opened.add_argument("--duration", type=float, default=None, help="stop sending after this many s")
    opened.add_argument("--max-concurrency", type=int, default=256, help="requests in flight at most")
    args = p.parse_args(argv)
    parts = urlsplit(args.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        p.error(f"--url {args.url!r}: write http://HOST:PORT")
    try:
        args.key = read_key(args.key_file, "MU_API_KEY")
    except ValueError as exc:
        p.error(str(exc))
    if not args.key:
        p.error("a tenant's API key is required: $MU_API_KEY or --key-file PATH")
    # NaN passes every comparison's "not <= 0", and inf divides a trace's times to 0: both refused.
    for flag, real in (
        ("--timeout", args.timeout),
        ("--rate-multiple", args.rate_multiple),
        ("--duration", args.duration),
    ):
        if real is not None and not (math.isfinite(real) and real > 0):
            p.error(f"{flag} must be a finite number > 0, got {real:g}")
    for flag, whole, most in (
        ("--max-tokens", args.max_tokens, MAX_TOKENS),
        ("--prompt-words", args.prompt_words, MAX_TOKENS),
        ("--max-concurrency", args.max_concurrency, MAX_CONCURRENCY),
    ):
        if not 1 <= whole <= most:
            p.error(f"{flag} must be from 1 to {most}, got {whole}")
    try:
        args.stages = parse_stages(args.stages)
    except ValueError as exc:
        p.error(str(exc))
    args.due = None
    if args.trace is not None:
        try:
            with open(args.trace, "rb") as raw:
                trace = read_trace(decoded(raw, args.trace), args.trace)
        except OSError as exc:
            p.error(f"--trace {args.trace}: {exc.strerror}")
        except TraceError as exc:
            p.error(str(exc))
        args.due = schedule(trace, args.rate_multiple, args.duration)
    return args


def say(line: str) -> None:
    print(line, flush=True)


async def run(args: argparse.Namespace) -> int:
    due: list[tuple[float, TraceRequest]] | None = args.due
    connections = args.max_concurrency if due is not None else max(n for _, n in args.stages)
    async with open_client(args.url, args.key, max(1, connections), args.timeout) as client:
        if (why := await unreachable(client)) is not None:
            print(f"{PROG}: nothing answers at {args.url} ({why}); is the router running?", file=sys.stderr)
            return 2
        progress = Progress()
        if due is not None:
            span = due[-1][0] if due else 0.0
            say(
                f"replaying {len(due)} requests of {args.trace} at {args.rate_multiple:g}x over {span:.0f} s"
                f" (at most {args.max_concurrency} in flight)"
            )
            work = replay(client, args.model, args.stream, due, args.max_concurrency, args.timeout, progress)
        else:
            body = completion_body(args.model, "hello " * args.prompt_words, args.max_tokens, args.stream)
            work = run_stages(client, body, args.stages, args.timeout, progress)
        total = await report(work, progress, say)
    return 0 if total.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:  # Ctrl-C: the total line is out already
        return 130


if __name__ == "__main__":
    sys.exit(main())
