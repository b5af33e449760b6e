"""The official openai SDK, sync and async, against the simulated engine over HTTP: every
parameter behaves as vLLM's does (checked against vLLM 0.32's answers to the same requests)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion

from tests.runtime.support import SimProcess, sim_engine

pytestmark = pytest.mark.stack  # a simulated engine as a subprocess

MODEL = "sim-tiny"
HI = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with sim_engine("--profile", "tiny-test", "--time-scale", "100") as engine:
        yield engine


def test_completion_counts_prompt_and_output_tokens(client: openai.OpenAI) -> None:
    # "Hello world!" is 12 bytes -> 3 tokens of 4 bytes.
    done = client.completions.create(model=MODEL, prompt="Hello world!", max_tokens=5)
    assert isinstance(done, Completion) and done.object == "text_completion"
    assert done.choices[0].finish_reason == "length" and done.choices[0].text
    assert done.system_fingerprint == "simulated-tiny-test"
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (3, 5, 8)


def test_completion_without_max_tokens_gets_vllms_default_of_16(client: openai.OpenAI) -> None:
    done = client.completions.create(model=MODEL, prompt="Hello")
    assert done.usage is not None and done.usage.completion_tokens == 16


def test_chat_answers_as_the_assistant(client: openai.OpenAI) -> None:
    # One message: <|im_start|> <|user|> "\n" + ceil(8 / 4) = 2 + <|im_end|> -> 6 prompt tokens.
    done = client.chat.completions.create(model=MODEL, messages=HI, max_completion_tokens=4)
    assert isinstance(done, ChatCompletion) and done.object == "chat.completion"
    assert done.choices[0].message.role == "assistant" and done.choices[0].message.content
    assert done.usage is not None and (done.usage.prompt_tokens, done.usage.completion_tokens) == (6, 4)


def test_n_gives_n_different_choices_numbered_from_0(client: openai.OpenAI) -> None:
    done = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, n=3, seed=1)
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert len({c.text for c in done.choices}) == 3
    assert done.usage is not None and done.usage.completion_tokens == 18  # 3 x 6; the prompt once
    assert done.usage.prompt_tokens == 2
    chat = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, n=2, seed=1)
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.usage is not None and chat.usage.completion_tokens == 6


def test_prompt_lists_give_one_choice_per_prompt_and_choice_prompt_major(client: openai.OpenAI) -> None:
    # vLLM numbers choices prompt x n + choice: with echo each choice starts with its prompt.
    done = client.completions.create(model=MODEL, prompt=["a", "bb"], max_tokens=2, n=2, echo=True)
    assert [c.index for c in done.choices] == [0, 1, 2, 3]
    assert [c.text.startswith(p) for c, p in zip(done.choices, ["a", "a", "bb", "bb"], strict=True)] == [
        True
    ] * 4
    assert done.usage is not None and done.usage.prompt_tokens == 2  # one token per prompt, not per choice
    ids = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=1)
    assert ids.usage is not None and ids.usage.prompt_tokens == 3 and len(ids.choices) == 1
    lists = client.completions.create(model=MODEL, prompt=[[5, 6], [7, 8, 9]], max_tokens=1)
    assert [c.index for c in lists.choices] == [0, 1]
    assert lists.usage is not None and lists.usage.prompt_tokens == 5


def test_best_of_is_accepted_and_ignored_as_vllm_does(client: openai.OpenAI) -> None:
    # vLLM 0.32's request models have no best_of: it is an extra field, ignored.
    done = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, best_of=3)
    assert len(done.choices) == 1


def test_the_same_seed_gives_the_same_text(client: openai.OpenAI) -> None:
    def text(**kwargs: object) -> str:
        return client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, **kwargs).choices[0].text

    assert text(seed=7) == text(seed=7)
    assert text(seed=7) != text(seed=8)
    assert text() != text()  # unseeded sampling differs (32 words, 8 tokens: 1 in 10^12 alike)
    assert text(temperature=0) == text(temperature=0, seed=3)  # greedy ignores the seed
    # vLLM seeds choice i with seed + i: the second of n=2 at seed 7 is the first at seed 8.
    two = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, n=2, seed=7)
    assert two.choices[1].text == text(seed=8)


def test_stop_cuts_the_text_before_the_stop_string(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt="Hello", max_tokens=40, seed=5).choices[0].text
    stop = full[10:12]
    done = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=40, seed=5, stop=[stop], logprobs=0
    )
    choice = done.choices[0]
    assert choice.text == full[: full.index(stop)]
    assert choice.finish_reason == "stop"
    assert choice.model_extra is not None and choice.model_extra["stop_reason"] == stop
    # Generation ends at the token that completes the stop string, and that token is counted.
    assert choice.logprobs is not None and choice.logprobs.tokens is not None
    tokens = choice.logprobs.tokens
    assert stop in "".join(tokens) and stop not in "".join(tokens[:-1])
    assert done.usage is not None and done.usage.completion_tokens == len(tokens) < 40
    kept = client.completions.create(
        model=MODEL,
        prompt="Hello",
        max_tokens=40,
        seed=5,
        stop=stop,
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == full[: full.index(stop) + len(stop)]


def test_a_stream_never_shows_a_stop_string_even_in_part(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt="Hello", max_tokens=40, seed=9).choices[0].text
    stop = full[12:15]
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=40, seed=9, stop=[stop], stream=True
        )
    )
    texts = [c.choices[0].text for c in chunks]
    assert "".join(texts) == full[: full.index(stop)]
    # The last 2 characters (longest stop - 1) are held back until the match is decided, so no
    # character of the stop string is sent before the stream ends.
    assert len("".join(texts[:-1])) <= full.index(stop)
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"


def test_chat_stop_and_streams_per_choice(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=30, seed=4)
    content = full.choices[0].message.content or ""
    stop = content[8:10]
    done = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=30, seed=4, stop=stop)
    assert done.choices[0].message.content == content[: content.index(stop)]
    assert done.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, n=2, seed=4, stream=True)
    text: dict[int, str] = {0: "", 1: ""}
    roles, finished = [], []
    for chunk in stream:
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            roles += [choice.index] if choice.delta.role == "assistant" else []
            finished += [choice.index] if choice.finish_reason else []
    assert sorted(roles) == [0, 1] and sorted(finished) == [0, 1]  # each choice opens and ends
    again = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, n=2, seed=4)
    assert [text[0], text[1]] == [c.message.content for c in again.choices]


def test_completion_logprobs_in_vllms_integer_form(client: openai.OpenAI) -> None:
    done = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, logprobs=3, seed=2)
    choice = done.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert "".join(lp.tokens) == choice.text and len(lp.tokens) == 6
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob is not None and logprob < 0
        assert len(top) == 3 and top[token] == logprob == max(top.values())  # the token is the likeliest
    again = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, logprobs=3, seed=2)
    assert again.choices[0].logprobs == lp  # deterministic


def test_chat_logprobs_with_top_logprobs(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=4, logprobs=True, top_logprobs=2
    )
    content = done.choices[0].logprobs.content
    assert content is not None and len(content) == 4
    assert "".join(t.token for t in content) == done.choices[0].message.content
    for token in content:
        assert token.bytes == list(token.token.encode())
        assert token.top_logprobs[0].token == token.token and len(token.top_logprobs) == 2
    plain = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, logprobs=True)
    assert [t.top_logprobs for t in plain.choices[0].logprobs.content] == [[], []]


def test_echo_prepends_the_prompt(client: openai.OpenAI) -> None:
    done = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=2, echo=True, logprobs=1)
    choice = done.choices[0]
    assert choice.text.startswith("Hello world") and len(choice.text) > len("Hello world")
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None  # nothing precedes the first prompt token
    only = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=0, echo=True)
    assert only.choices[0].text == "Hello world"
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[*HI, {"role": "assistant", "content": "Sure,"}],
        max_tokens=2,
        extra_body={"echo": True},
    )
    assert (chat.choices[0].message.content or "").startswith("Sure,")


def test_include_usage_adds_a_final_usage_chunk_only_when_asked(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=["a", "b"],
            max_tokens=2,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (2, 8)
    assert all(c.usage is None for c in chunks[:-1])
    assert sorted(c.choices[0].index for c in chunks[:-1]) == [0, 0, 1, 1, 2, 2, 3, 3]
    plain = list(client.completions.create(model=MODEL, prompt="a", max_tokens=2, stream=True))
    assert all(c.usage is None and c.choices for c in plain)
    chat = list(
        client.chat.completions.create(
            model=MODEL, messages=HI, max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chat[-1].choices == [] and chat[-1].usage is not None and chat[-1].usage.completion_tokens == 3


def test_continuous_usage_stats_put_usage_in_every_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="a",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
    )
    assert [c.usage.completion_tokens for c in chunks if c.usage] == [1, 2, 3, 3]


def test_models_list_validates_as_the_sdks_model_type(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert len(models) == 1 and isinstance(models[0], Model)
    card = models[0]
    assert (card.id, card.object, card.owned_by) == (MODEL, "model", "vllm")
    assert isinstance(card.created, int) and card.created > 1_600_000_000
    assert card.model_extra is not None and card.model_extra["max_model_len"] == 512
    assert card.model_extra["root"] == MODEL and card.model_extra["simulated"] is True
    assert card.model_extra["permission"][0]["object"] == "model_permission"


def test_the_async_client_streams_and_completes(sim: SimProcess) -> None:
    async def run() -> tuple[str, str, int]:
        async with openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0) as aclient:
            done = await aclient.chat.completions.create(model=MODEL, messages=HI, max_tokens=5, seed=11)
            stream = await aclient.chat.completions.create(
                model=MODEL,
                messages=HI,
                max_tokens=5,
                seed=11,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, usage = "", 0
            async for chunk in stream:
                text += "".join(c.delta.content or "" for c in chunk.choices)
                usage = chunk.usage.completion_tokens if chunk.usage else usage
            return done.choices[0].message.content or "", text, usage

    done, streamed, usage = asyncio.run(run())
    assert done == streamed and usage == 5


def test_with_streaming_response_reads_sse_lines_to_done(client: openai.OpenAI) -> None:
    with client.completions.with_streaming_response.create(
        model=MODEL, prompt="x", max_tokens=3, stream=True
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    assert len(lines) == 4 and lines[-1] == "data: [DONE]"
