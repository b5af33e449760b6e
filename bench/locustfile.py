"""Locust users that stream completions through the router, as an SDK client does.

    MU_API_KEY=$(cat var/keys/acme.key) .venv/bin/locust -f bench/locustfile.py --headless -u 4 -r 4 \\
        -t 30s --host http://127.0.0.1:8080 --model summarize [--max-tokens 64] --csv var/locust

Each user sends ``POST /v1/completions`` with ``stream: true`` and ``stream_options.include_usage``
and reads the SSE body to its end on a kept-alive connection. A request succeeds when the answer
is 200 and its stream reads as ``dataplane.loadgen.measure.StreamReading`` wants (no error event,
``data: [DONE]`` at the end); its response time is end to end (locust times a streamed request
to its headers only), and its time to first content chunk is a second entry, "time to first
token". Locust is a dev tool (gevent patches the interpreter): it
lives here, not in ``dataplane/``, whose every module the boundary test imports, and the product
never needs it. ``python -m dataplane.loadgen`` measures the same figures without locust.
"""

from __future__ import annotations

import time
from typing import Any

import requests
from locust import HttpUser, events, task
from locust.argument_parser import LocustArgumentParser

from dataplane.loadgen.measure import StreamReading, time_to_first_token
from dataplane.loadgen.run import COMPLETIONS, completion_body


@events.init_command_line_parser.add_listener
def _options(parser: LocustArgumentParser) -> None:
    parser.add_argument("--model", default="sim-tiny", help="the endpoint's name")
    parser.add_argument(
        "--api-key",
        default="none",
        env_var="MU_API_KEY",  # the key off the command line, where ps shows it to every user
        help="a tenant's API key, best in $MU_API_KEY (static mode needs none)",
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=20)


class StreamingCompletions(HttpUser):
    @task
    def stream_completion(self) -> None:
        options: Any = self.environment.parsed_options
        body = completion_body(
            options.model, "hello " * options.prompt_words, options.max_tokens, stream=True
        )
        headers = {"authorization": f"Bearer {options.api_key}"}
        started = time.perf_counter()
        with self.client.post(
            COMPLETIONS, json=body, headers=headers, stream=True, catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            reading = StreamReading()
            try:
                for line in response.iter_lines(decode_unicode=True):
                    reading.feed(time.perf_counter(), line)
            except requests.RequestException as exc:
                response.failure(f"{type(exc).__name__}: {exc}")
                return
            outcome = reading.outcome(started, time.perf_counter())
            response.request_meta["response_time"] = (outcome.ended_s - started) * 1000
            if outcome.error is not None:
                response.failure(outcome.error)
                return
            response.success()
        if (ttft := time_to_first_token(outcome)) is not None:
            events.request.fire(
                request_type="SSE",
                name="time to first token",
                response_time=ttft * 1000,
                response_length=0,
                exception=None,
                context={},
            )
