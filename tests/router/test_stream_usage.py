"""The pure parts of exact metering: the body the router forwards (``pod_body``) and the reading
of a stream as it passes (``StreamUsage``), on the bytes vLLM 0.32 sends (compact pydantic JSON)."""

import json

import pytest

from dataplane.router.pricing import CostModel, metered
from dataplane.router.proxy import USAGE_SPAN, UsageScan, parse_usage, pod_body
from dataplane.router.stream_usage import MAX_HELD_BYTES, StreamUsage, mu_text

C = CostModel(0.002, 0.02, 0.1)


def forwarded(body: dict, raw: bytes | None = None) -> tuple[dict, bool, bytes]:
    """(the forwarded body, whether the router asked for the usage chunk, its bytes); the router
    asks for every stream's usage in each chunk (continuous stats) too."""
    raw = json.dumps(body).encode() if raw is None else raw
    out, asked, every_chunk = pod_body(raw, json.loads(raw))
    doc = json.loads(out)
    assert every_chunk == (doc["stream_options"].get("continuous_usage_stats") is True)
    return doc, asked, out


ASKED = {"include_usage": True, "continuous_usage_stats": True}


def test_a_stream_without_stream_options_gets_usage_asked_by_inserting_bytes():
    raw = b'  {"model": "m", "prompt": "hi", "stream": true}'
    doc, asked, out = forwarded({}, raw)
    assert asked and doc["stream_options"] == ASKED
    assert out == (
        b'  {"stream_options":{"include_usage":true,"continuous_usage_stats":true},'
        b'"model": "m", "prompt": "hi", "stream": true}'
    )


@pytest.mark.parametrize(
    "options",
    [
        None,
        {},
        {"include_usage": False},
        # without include_usage vLLM sends no per-chunk usage either: the router takes it out
        {"continuous_usage_stats": True},
        {"continuous_usage_stats": False},
    ],
)
def test_stream_options_without_include_usage_are_dumped_again_with_it(options):
    doc, asked, _ = forwarded({"model": "m", "prompt": "hi", "stream": True, "stream_options": options})
    assert asked and doc["stream_options"] == ASKED and doc["prompt"] == "hi"


@pytest.mark.parametrize("continuous", [None, False, "no"])
def test_a_clients_usage_chunk_gets_the_usage_in_every_chunk_asked_beside_it(continuous):
    """The client asked for the usage chunk (it keeps it) but not for usage in every chunk: the
    router asks for it (the prompt's count in the first chunk) and takes it out of each chunk."""
    options = {"include_usage": True} | ({} if continuous is None else {"continuous_usage_stats": continuous})
    body = {"model": "m", "prompt": "hi", "stream": True, "stream_options": options}
    out, asked, every_chunk = pod_body(json.dumps(body).encode(), body)
    assert json.loads(out)["stream_options"] == ASKED and not asked and every_chunk


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "prompt": "hi"},  # not a stream
        {"model": "m", "prompt": "hi", "stream": False, "stream_options": None},
        {"model": "m", "prompt": "hi", "stream": True, "stream_options": ASKED},  # the client's own
        {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": 1, "continuous_usage_stats": "yes"},
        },
        # values the engine refuses: its 400
        {"model": "m", "prompt": "hi", "stream": True, "stream_options": "yes"},
        {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": 7},
        },
    ],
)
def test_other_bodies_are_forwarded_as_they_came(body):
    raw = json.dumps(body).encode()
    assert pod_body(raw, body) == (raw, False, False)


@pytest.mark.parametrize("options", [None, {"include_usage": True}])
def test_a_streams_stream_interval_is_dropped(options):
    """vLLM batches ``stream_interval`` tokens a chunk: a reset stream would be counted low."""
    body = {"model": "m", "stream": True, "stream_interval": 50}
    if options:
        body["stream_options"] = options
    doc, asked, _ = forwarded(body)
    assert "stream_interval" not in doc and doc["stream_options"]["include_usage"] is True
    assert asked == (options is None)


@pytest.mark.parametrize("flag", [1, 1.0, "true", "1", "yes", "On", " t ", "Y"])
def test_a_stream_flag_vllm_reads_as_true_is_a_stream(flag):
    """pydantic's lax bool: vLLM streams for ``"stream": 1`` or ``"true"``; the router must ask
    its usage and drop its stream_interval as for ``true``."""
    doc, asked, _ = forwarded({"model": "m", "stream": flag, "stream_interval": 50})
    assert asked and doc["stream_options"]["include_usage"] is True and "stream_interval" not in doc


@pytest.mark.parametrize("flag", [1, "true", "1", "YES", "on"])
def test_a_clients_include_usage_vllm_reads_as_true_is_the_clients(flag):
    """The client asked for the usage chunk: it is not the router's to drop."""
    body = {"model": "m", "stream": "true", "stream_options": {"include_usage": flag}}
    out, asked, every_chunk = pod_body(json.dumps(body).encode(), body)
    assert json.loads(out)["stream_options"] == {"include_usage": flag, "continuous_usage_stats": True}
    assert not asked and every_chunk


@pytest.mark.parametrize("flag", [0, "false", "0", "no", "off", "f", "n", None, "maybe", 2])
def test_a_stream_flag_vllm_reads_as_false_or_refuses_is_forwarded_as_it_came(flag):
    body = {"model": "m", "stream": flag}
    raw = json.dumps(body).encode()
    assert pod_body(raw, body) == (raw, False, False)


def test_a_body_with_a_byte_order_mark_is_dumped_again():
    raw = b"\xef\xbb\xbf" + json.dumps({"model": "m", "stream": True}).encode()
    out, asked, every_chunk = pod_body(raw, json.loads(raw))
    assert asked and every_chunk
    assert json.loads(out) == {"model": "m", "stream": True, "stream_options": ASKED}


def event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


HEAD = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}


def token(i: int, text: str, finish: str | None = None) -> dict:
    return {**HEAD, "choices": [{"index": i, "text": text, "finish_reason": finish}]}


USAGE = {**HEAD, "choices": [], "usage": {"prompt_tokens": 9, "total_tokens": 12, "completion_tokens": 3},
         "system_fingerprint": "fp-1"}  # fmt: skip
DONE = b"data: [DONE]\n\n"


def price(p: int, c: int) -> float:
    return C.cost(p, c)


def test_the_usage_the_router_asked_for_is_dropped_and_the_fingerprint_put_back():
    s = StreamUsage(hide_usage=True, price=price)
    stream = [event(token(0, "a")), event(token(0, "b")), event(token(0, "c", "length")), event(USAGE), DONE]
    whole = b"".join(stream)
    # fed in odd pieces, events split across reads: the client gets whole events only
    out = b"".join(s.feed(whole[i : i + 7]) for i in range(0, len(whole), 7)) + s.end()
    last = {**token(0, "c", "length"), "system_fingerprint": "fp-1"}  # as vLLM stamps it without usage
    assert out == event(token(0, "a")) + event(token(0, "b")) + event(last) + DONE
    assert (s.usage, s.tokens) == ((9, 3), 3)


@pytest.mark.parametrize(
    "usage_chunk",
    [
        {**HEAD, "usage": {"completion_tokens": 3, "prompt_tokens": 9}, "choices": []},  # usage first
        {**HEAD, "choices": [], "usage": {"total_tokens": 12, "completion_tokens": 3, "prompt_tokens": 9}},
    ],
)
def test_a_usage_chunk_in_another_layout_is_read_from_its_usage_key(usage_chunk):
    """vLLM's layout is read in one match; any other one from the usage key on."""
    s = StreamUsage(hide_usage=True, price=price)
    out = s.feed(event(token(0, "a", "length")) + event(usage_chunk) + DONE) + s.end()
    assert out == event(token(0, "a", "length")) + DONE
    assert (s.usage, s.tokens) == ((9, 3), 3)


@pytest.mark.parametrize(
    "usage_chunk",
    [
        USAGE,  # vLLM's layout, its fingerprint after usage: read in one match
        {**HEAD, "system_fingerprint": "fp-1", "choices": [], "usage": USAGE["usage"]},  # before choices
        {**USAGE, "model": 'a"b\\'},  # an escaped quote and backslash in a string before choices
        {
            **USAGE,
            "model": 'x","choices":[],"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1}}',
        },
    ],
)
@pytest.mark.parametrize("hide_usage", [True, False])
def test_the_usage_chunk_reads_the_same_in_vllms_layout_and_any_other(usage_chunk, hide_usage):
    """The fast reading of vLLM's usage event and the general one agree: the counts, the event
    cut out (or passed with mu) and its fingerprint put back, wherever it sits in the chunk."""
    s = StreamUsage(hide_usage=hide_usage, price=price)
    out = s.feed(event(token(0, "a")) + event(token(0, "b", "length")) + event(usage_chunk) + DONE) + s.end()
    assert (s.usage, s.tokens) == ((9, 3), 3)
    if hide_usage:
        last = {**token(0, "b", "length"), "system_fingerprint": "fp-1"}
        assert out == event(token(0, "a")) + event(last) + DONE
    else:
        chunks = [json.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
        assert chunks[2] == {**usage_chunk, "usage": {**USAGE["usage"], "mu": pytest.approx(0.178)}}


def test_with_n_2_the_chunks_after_the_first_terminal_one_wait_for_the_usage_chunk():
    s = StreamUsage(hide_usage=True, price=price)
    assert s.feed(event(token(0, "a")) + event(token(1, "x"))) == event(token(0, "a")) + event(token(1, "x"))
    assert s.feed(event(token(0, "b", "stop"))) == b""  # held: its fingerprint is in the usage chunk
    assert s.feed(event(token(1, "y", "length"))) == b""
    assert s.tokens == 2
    out = s.feed(event(USAGE) + DONE)
    stamp = {"system_fingerprint": "fp-1"}
    assert (
        out == event({**token(0, "b", "stop"), **stamp}) + event({**token(1, "y", "length"), **stamp}) + DONE
    )
    assert (s.usage, s.tokens) == ((9, 3), 3)  # from the usage chunk on, its count


def test_usage_the_client_asked_for_comes_with_mu():
    s = StreamUsage(hide_usage=False, price=price)
    out = s.feed(event(token(0, "a", "length")) + event(USAGE) + DONE)
    chunks = [json.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
    assert chunks[0] == token(0, "a", "length")
    assert chunks[1]["usage"] == {**USAGE["usage"], "mu": pytest.approx(0.002 * 9 + 0.02 * 3 + 0.1)}
    assert chunks[1]["system_fingerprint"] == "fp-1"


def test_delivered_tokens_skip_the_role_chunk_and_count_each_choice_chunk():
    s = StreamUsage(hide_usage=True, price=price, chat=True)
    chat = {**HEAD, "object": "chat.completion.chunk"}
    role = {
        **chat,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
    }
    word = {**chat, "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
    error = b'data: {"error": {"message": "boom"}}\n\n'
    out = s.feed(event(role) + event(word) + event(word) + error)
    assert out == event(role) + event(word) + event(word) + error
    assert (s.tokens, s.usage) == (2, None)  # cut here: 2 tokens delivered, no usage


def test_a_stream_cut_before_its_usage_releases_nothing_it_held():
    s = StreamUsage(hide_usage=True, price=price)
    s.feed(event(token(0, "a")) + event(token(0, "b", "length")))
    assert s.tokens == 1  # the terminal chunk waits for the usage chunk that never comes
    assert s.end() == event(token(0, "b", "length")) and s.tokens == 2  # a clean end sends it


def test_metered_prices_usage_else_what_was_delivered():
    est = (100, 256)
    assert metered(C, est, (90, 40), 7, 200) == (pytest.approx(1.08), 90, 40)
    assert metered(C, est, None, 20, 200) == (pytest.approx(0.7), 100, 20)  # a reset after 20 tokens
    assert metered(C, est, None, 0, 200) == (pytest.approx(0.3), 100, 0)  # a stream that ended empty
    # refused by the engine (the tenant's prompt, or a name the platform changed): nothing
    assert metered(C, est, None, 0, 400) == (0.0, 0, 0)
    assert metered(C, est, None, 0, 400, answered=True) == (0.0, 0, 0)
    assert metered(C, est, None, 0, 404, answered=True, image_tokens=256) == (0.0, 0, 0)
    assert metered(C, est, None, 0, 400, client_cut=True) == (0.0, 0, 0)
    # the platform's failures: nothing, whatever was delivered before
    assert metered(C, est, None, 0, 500, answered=True) == (0.0, 0, 0)
    assert metered(C, est, None, 3, 502) == (0.0, 0, 0)  # pod lost after 3 tokens
    assert metered(C, est, None, 3, 200, failed=True) == (0.0, 0, 0)  # a router's cut, an error event
    assert metered(C, est, None, 0, 0) == (0.0, 0, 0)  # a pod lost before its head
    # a client's reset before any token, the pod working: the estimate
    assert metered(C, est, None, 0, 0, client_cut=True) == (pytest.approx(5.42), 100, 256)
    assert metered(C, est, None, 0, 200, client_cut=True) == (pytest.approx(5.42), 100, 256)
    assert metered(C, est, None, 20, 200, client_cut=True) == (pytest.approx(0.7), 100, 20)
    # a whole answer without usage: the most it could cost, never 0
    assert metered(C, est, None, 0, 200, answered=True) == (pytest.approx(5.42), 100, 256)
    # the engine's count of the prompt, read before the usage chunk, prices it over the estimate
    assert metered(C, est, None, 20, 200, client_cut=True, prompt_tokens=90) == (pytest.approx(0.68), 90, 20)
    assert metered(C, (25, 256), None, 20, 200, prompt_tokens=100) == (pytest.approx(0.7), 100, 20)
    assert metered(C, est, None, 0, 200, client_cut=True, prompt_tokens=400)[1:] == (400, 256)
    assert metered(C, est, (90, 40), 7, 200, prompt_tokens=400)[1:] == (90, 40)  # the usage rules


def test_mu_text_is_a_short_decimal():
    assert [mu_text(x) for x in (1.08, 4.1000000001, 0.0, 12345.5, 1e-9)] == [
        "1.08",
        "4.1",
        "0",
        "12345.5",
        "0",
    ]


def _chat_answer(spaced: bool) -> bytes:
    """A chat answer as vLLM lays it out: usage, then prompt_logprobs whose decoded tokens spell
    "usage" and usage-looking text (strings: their quotes escaped)."""
    logprobs = [
        {"7": {"logprob": -1.0, "rank": 1, "decoded_token": t}}
        for t in ("usage", '"usage":{"prompt_tokens":1,"completion_tokens":0}', "x")
    ] * 400
    doc = {"id": "c", "choices": [{"index": 0, "message": {"content": "usage"}}],
           "usage": {"prompt_tokens": 1200, "total_tokens": 1234, "completion_tokens": 34,
                     "prompt_tokens_details": None},
           "prompt_logprobs": logprobs, "prompt_token_ids": None}  # fmt: skip
    return json.dumps(doc, separators=(", ", ": ") if spaced else (",", ":")).encode()


@pytest.mark.parametrize("spaced", [False, True])
def test_the_usage_is_the_usage_object_wherever_it_sits(spaced):
    body = _chat_answer(spaced)
    assert len(body) > 50_000 and body.count(b"usage") > 500
    assert parse_usage(body) == (1200, 34)  # held whole
    for size in (1, 7, 16, 17, 100, 4096):  # passed through, read by read
        scan = UsageScan()
        for i in range(0, len(body), size):
            scan.feed(body[i : i + size])
        assert scan.end() == (1200, 34), size
        assert len(scan._kept) <= USAGE_SPAN  # bounded: nothing of the body kept


@pytest.mark.parametrize(
    "body", [b'{"usage":null}', b'{"usage":{"prompt_tokens":3}}', b'{"a":"\\"usage\\":{"}', b""]
)
def test_an_answer_without_a_usage_object_reports_none(body):
    assert parse_usage(body) is None


WORDS = ["The", " cat", " sat", " on", " the", " mat", ",", " and", " é", "😀"]


def test_a_merged_chunk_counts_the_tokens_its_text_holds():
    """A client that stops reading makes vLLM merge the waiting tokens into one chunk: a cut
    stream counts at least half of them, never 1 a chunk; one-token chunks count 1 each."""
    s = StreamUsage(hide_usage=True, price=price)
    singles = b"".join(event(token(0, WORDS[i % len(WORDS)])) for i in range(10))
    s.feed(singles)
    assert s.tokens == 10
    merged = "".join(WORDS[1 + i % 5] for i in range(50)).replace(" on", " in ")[:200]  # 50 4-char tokens
    s.feed(event(token(0, merged)))
    assert 25 <= s.tokens - 10 <= 50
    first = s.tokens
    s.feed(event(token(0, "x")) + event(token(0, merged)) + event(token(0, "y")))  # mixed in one read
    assert 2 + 25 <= s.tokens - first <= 2 + 50


@pytest.mark.parametrize("spaced", [False, True])
def test_one_token_chunks_count_one_each_whatever_their_text(spaced):
    """Non-ASCII (escaped \\u by the sim's json.dumps), long tokens, chat's opening chunk."""
    sep = (", ", ": ") if spaced else (",", ":")
    chat = {**HEAD, "object": "chat.completion.chunk"}

    def chunk(delta: dict) -> bytes:
        doc = {**chat, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        return b"data: " + json.dumps(doc, separators=sep).encode() + b"\n\n"

    s = StreamUsage(hide_usage=True, price=price, chat=True)
    s.feed(chunk({"role": "assistant", "content": ""}))
    texts = ["a", "😀", "\ufffd\ufffd\ufffd\ufffd", "ééé", "\n\n", "  ", "elephant", '"\\"']
    for text in texts:  # one read each, then all in one read
        s.feed(chunk({"content": text}))
    s.feed(b"".join(chunk({"content": t}) for t in texts))
    assert s.tokens == 2 * len(texts)


def test_with_n_2_what_is_held_for_the_fingerprint_is_bounded():
    """Choice 0 finished, choice 1 streams 10,000 more chunks: past MAX_HELD_BYTES they go on as
    they came (unstamped) and count as delivered, never held whole."""
    s = StreamUsage(hide_usage=True, price=price)
    assert s.feed(event(token(0, "a", "stop"))) == b""  # held for its fingerprint
    parts = []
    for _ in range(10_000):
        parts.append(s.feed(event(token(1, "word"))))
        assert len(s._held) <= MAX_HELD_BYTES
    out = b"".join(parts)
    assert s.tokens == 10_001 and out.startswith(event(token(0, "a", "stop")))
    out += s.feed(event(token(1, "end", "length")) + event(USAGE) + DONE)
    assert out.endswith(DONE) and b'"choices":[]' not in out  # the usage chunk still dropped
    assert (s.usage, s.tokens) == ((9, 3), 3)


def with_usage(chunk: dict, completion: int) -> dict:
    """A chunk as vLLM sends it with continuous usage stats: its usage so far after its choices."""
    return {
        **chunk,
        "usage": {"prompt_tokens": 9, "total_tokens": 9 + completion, "completion_tokens": completion},
    }


@pytest.mark.parametrize("spaced", [False, True])
@pytest.mark.parametrize("hide_usage", [True, False])
def test_the_usage_in_every_chunk_the_client_did_not_ask_for_is_taken_out(spaced, hide_usage):
    """The router asked for continuous usage stats: the client gets each chunk without its usage,
    byte for byte as the engine sends it without them, and the prompt's count is read from the
    first chunk; the usage chunk is the router's (dropped) or the client's (with mu)."""
    sep = (", ", ": ") if spaced else (",", ":")

    def ev(obj: dict) -> bytes:
        return b"data: " + json.dumps(obj, separators=sep).encode() + b"\n\n"

    tokens = [token(0, "a"), token(0, "b"), token(0, "c", "length")]
    s = StreamUsage(hide_usage=hide_usage, price=price, strip_usage=True)
    first = s.feed(ev(with_usage(tokens[0], 1)))
    assert first == ev(tokens[0]) and s.prompt_tokens == 9 and s.usage is None
    rest = s.feed(ev(with_usage(tokens[1], 2)) + ev(with_usage(tokens[2], 3)) + ev(USAGE) + DONE) + s.end()
    assert (s.usage, s.tokens, s.prompt_tokens) == ((9, 3), 3, 9)
    if hide_usage:
        assert rest == ev(tokens[1]) + ev({**tokens[2], "system_fingerprint": "fp-1"}) + DONE
    else:
        assert rest.startswith(ev(tokens[1]) + ev(tokens[2])) and b'"mu"' in rest


def test_the_usage_in_every_chunk_the_client_asked_for_passes():
    s = StreamUsage(hide_usage=False, price=price)
    events = event(with_usage(token(0, "a"), 1)) + event(with_usage(token(0, "b", "length"), 2))
    assert s.feed(events) == events and s.prompt_tokens == 9


def test_without_usage_in_its_first_chunk_a_stream_has_no_prompt_count():
    s = StreamUsage(hide_usage=True, price=price, strip_usage=True)
    s.feed(event(token(0, "a")))
    s.feed(event(with_usage(token(0, "b"), 2)))  # read from the first chunk only
    assert s.prompt_tokens is None and s.tokens == 2


@pytest.mark.parametrize(
    "events",
    [
        [b'data: {"error": {"message": "logprobs", "type": "BadRequestError", "code": 400}}\n\n', DONE],
        [event(token(0, "a")), b'data: {"error":{"message":"engine dead","code":500}}\n\n', DONE],
    ],
    ids=["refused after its 200", "failed mid-stream"],
)
def test_an_error_event_marks_the_stream_failed(events):
    s = StreamUsage(hide_usage=True, price=price)
    for e in events:
        s.feed(e)
    assert s.failed and s.usage is None


def test_text_that_spells_an_error_event_is_no_error():
    s = StreamUsage(hide_usage=True, price=price)
    s.feed(event(token(0, 'data: {"error": 1}')) + event(token(0, "b", "length")) + event(USAGE) + DONE)
    assert not s.failed and s.usage == (9, 3)
