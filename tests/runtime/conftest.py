"""Fixtures for the runtime tests (helpers live in ``support``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from tests.runtime.support import EventSink, SimProcess, sim_engine


@pytest.fixture
def start_sim() -> Iterator[Callable[..., SimProcess]]:
    """Start simulated engines (``start_sim("--profile", "tiny-test")``); all killed after."""
    stack: list[Any] = []

    def start(*args: str) -> SimProcess:
        cm = sim_engine(*args)
        stack.append(cm)
        return cm.__enter__()

    try:
        yield start
    finally:
        for cm in reversed(stack):
            cm.__exit__(None, None, None)


@pytest.fixture
def event_sink() -> Iterator[EventSink]:
    sink = EventSink()
    sink.start()
    try:
        yield sink
    finally:
        sink.stop()


@pytest.fixture(scope="module")
def client(sim: SimProcess) -> openai.OpenAI:
    """The official openai SDK on the module's ``sim`` engine (each module starts its own)."""
    return openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
