"""Fixtures for the runtime tests (helpers live in ``support``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from tests.runtime.support import (
    EventSink,
    RealPod,
    SimProcess,
    TinyModel,
    make_tiny_vllm,
    running_pod,
    save_measurements,
    sim_engine,
    tree_rss_mib,
)


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


# Real vLLM (scripts/test-vllm.sh): one pod on the tiny model for the session, since a vLLM start
# takes a minute or more on 2 CPUs. Its users leave it idle and healthy for the next.


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    started = time.monotonic()
    model, env = make_tiny_vllm(tmp_path_factory.mktemp("vllm"))
    return TinyModel(model, env, time.monotonic() - started)


@pytest.fixture(scope="session")
def real_pod(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealPod]:
    """A vLLM pod (launcher, prober, ``--max-num-seqs 2``) serving the tiny model as "tiny"."""
    with running_pod(tmp_path_factory.mktemp("pod"), tiny_model) as pod:
        pod.measurements["model_made_s"] = tiny_model.made_s
        pod.measurements["rss_ready_mib"] = tree_rss_mib(pod.proc.pid)
        yield pod
    save_measurements("vllm-measurements.json", pod.measurements)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``own_vllm_pod`` first, before the session's pod starts: two vLLM engines
    starting at once on 2 CPUs slow each other."""
    items.sort(key=lambda item: item.get_closest_marker("own_vllm_pod") is None)
