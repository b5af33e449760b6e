"""The load generator's measuring, on synthetic chunk times: TTFT, ITL, percentiles, what counts
as content, what counts as a failure, and the report line."""

import json
import re

import pytest

from dataplane.loadgen.measure import (
    BAD_JSON,
    CONNECT_BACK_OFF_S,
    MAX_BACK_OFF_S,
    NO_DONE,
    Outcome,
    StreamReading,
    Tally,
    answered,
    inter_token_latencies,
    percentile,
    refused,
    time_to_first_token,
)


def data(chunk: object) -> str:
    return "data: " + json.dumps(chunk)


def text_chunk(text: str) -> str:
    return data({"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}]})


USAGE = data({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
DONE = "data: [DONE]"


def read(lines: list[tuple[float, str]], started: float = 10.0, ended: float = 10.4) -> Outcome:
    reading = StreamReading()
    for now, line in lines:
        reading.feed(now, line)
    return reading.outcome(started, ended)


def test_ttft_and_itl_come_from_the_content_chunks_times():
    # The module's worked numbers: sent at 10.0, chunks at 10.20, 10.25, 10.35, ended at 10.40.
    outcome = read(
        [(10.20, text_chunk("a")), (10.25, text_chunk("b")), (10.35, text_chunk("c")), (10.36, DONE)]
    )
    assert outcome.error is None
    assert time_to_first_token(outcome) == pytest.approx(0.20)
    assert inter_token_latencies(outcome) == pytest.approx([0.05, 0.10])
    assert outcome.output_tokens == 3  # no usage chunk: the content chunks counted


def test_usage_empty_text_comments_and_blank_lines_are_not_content():
    outcome = read(
        [
            (10.1, ": ping"),
            (10.1, ""),
            (10.2, text_chunk("")),  # vLLM holding text back for a stop string
            (10.3, text_chunk("a")),
            (10.5, text_chunk("b")),
            (10.6, USAGE),
            (10.6, DONE),
        ]
    )
    assert time_to_first_token(outcome) == pytest.approx(0.3)
    assert inter_token_latencies(outcome) == pytest.approx([0.2])
    assert outcome.output_tokens == 3  # the usage chunk's count wins over the chunks counted


def test_a_stream_that_ends_without_done_failed():
    assert read([(10.1, text_chunk("a"))]).error == NO_DONE


@pytest.mark.parametrize(
    "event",
    [
        {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}},
        {"object": "error", "message": "boom", "type": "InternalServerError", "code": 500},
    ],
    ids=["vllm-0.32", "older-vllm"],
)
def test_an_error_event_inside_the_stream_fails_the_request(event):
    assert read([(10.1, text_chunk("a")), (10.2, data(event)), (10.3, DONE)]).error == "stream 500"


@pytest.mark.parametrize("line", ["data: {not json", "data: [1, 2]"])
def test_a_data_line_that_is_not_a_json_object_fails_the_request(line):
    assert read([(10.1, line), (10.2, DONE)]).error == BAD_JSON


def test_percentiles_are_nearest_rank():
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None


def test_a_429_or_503_backs_off_by_its_retry_after():
    assert refused(429, "3", 0.0, 0.1).back_off_s == 3.0
    assert refused(503, None, 0.0, 0.1).back_off_s == 1.0
    assert refused(429, "Wed, 21 Oct 2026 07:28:00 GMT", 0.0, 0.1).back_off_s == 1.0
    assert refused(429, "inf", 0.0, 0.1).back_off_s == MAX_BACK_OFF_S
    assert refused(429, "-5", 0.0, 0.1).back_off_s == 0.0
    assert refused(500, "3", 0.0, 0.1) == Outcome("500", 0.0, 0.1)
    assert CONNECT_BACK_OFF_S > 0


def test_a_whole_answer_counts_its_usage_tokens():
    body = {"choices": [{"text": "abc"}], "usage": {"prompt_tokens": 2, "completion_tokens": 7}}
    assert answered(json.dumps(body).encode(), 1.0, 1.5) == Outcome(None, 1.0, 1.5, output_tokens=7)
    assert answered(b"<html>", 1.0, 1.5).error == BAD_JSON


def test_the_tally_counts_failures_by_what_failed_and_times_only_successes():
    tally = Tally(sent=4)
    tally.record(Outcome(None, 0.0, 1.0, (0.2, 0.3, 0.5), output_tokens=3))
    tally.record(Outcome(None, 0.0, 2.0, output_tokens=5))  # not streamed: no TTFT, no ITL
    tally.record(Outcome("429", 0.0, 0.01))
    tally.record(Outcome("ReadTimeout", 0.0, 60.0, (1.0,)))
    assert (tally.ok, dict(tally.errors)) == (2, {"429": 1, "ReadTimeout": 1})
    assert tally.e2e_s == [1.0, 2.0] and tally.ttft_s == [0.2]
    assert tally.itl_s == pytest.approx([0.1, 0.2]) and tally.output_tokens == 8


def test_the_report_line_gives_throughput_per_second_of_the_period_and_the_percentiles():
    tally = Tally(sent=12)
    for _ in range(10):
        tally.record(Outcome(None, 0.0, 0.5, (0.1, 0.11, 0.13), output_tokens=3))
    tally.record(Outcome("503", 0.0, 0.1, back_off_s=1.0))
    line = tally.line("     5s clients   3", 5.0)
    assert line.startswith(
        "     5s clients   3  sent    12  ok    10  errors 503:1  req/s   2.0  tok/s     6"
    )
    assert "e2e p50 0.50s p99 0.50s  ttft p50 100.00ms p99 100.00ms  itl p50 10.00ms p99 20.00ms" in line
    # tests/test_rollout_stack.py reads the total line so: two counts, and "errors -" when clean.
    clean = Tally(sent=1)
    clean.record(Outcome(None, 0.0, 0.5))
    total = "total " + clean.line("5s", 5.0)
    assert re.findall(r"(?:sent|ok)\s+(\d+)", total) == ["1", "1"] and "errors -" in total
    assert "ttft -  itl -" in total
