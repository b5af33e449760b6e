"""A trace in the Azure LLM inference format: read, scheduled at a rate multiple, prompts sized as
the router estimates them."""

import re

import pytest

from dataplane.loadgen.trace import TraceError, TraceRequest, prompt_of, read_trace, schedule
from dataplane.router.pricing import estimate_input_tokens

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_requests_come_in_time_order_as_offsets_from_the_first():
    lines = [
        HEADER,
        "2023-11-16 18:15:50.9951690,396,109\n",
        "2023-11-16 18:15:46.6805900,374,44\n",  # out of order: sorted
        "2023-11-16 18:15:51.2224670,0,0\n",  # an engine refuses 0: sent at 1 token
        "\n",
    ]
    trace = read_trace(lines, "t.csv")
    assert [r.at_s for r in trace] == pytest.approx([0.0, 4.314579, 4.541877])
    assert [(r.context_tokens, r.generated_tokens) for r in trace] == [(374, 44), (396, 109), (1, 1)]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "t.csv: line 1 must be the header TIMESTAMP,ContextTokens,GeneratedTokens"),
        (["a,b,c\n"], "t.csv: line 1 must be the header"),
        ([HEADER], "t.csv: no requests after the header"),
        ([HEADER, "2023-11-16 18:15:46,374\n"], "t.csv: line 2 has 2 fields, expected 3"),
        ([HEADER, "yesterday,374,44\n"], "t.csv: line 2: TIMESTAMP 'yesterday' is not a date and time"),
        ([HEADER, "2023-11-16 18:15:46,many,44\n"], "t.csv: line 2: ContextTokens 'many' is not a whole"),
        (
            [HEADER, "2023-11-16 18:15:46,3,44\n", "2023-11-16 18:15:47,3,-1\n"],
            "t.csv: line 3: GeneratedTokens '-1'",
        ),
    ],
)
def test_a_bad_trace_names_the_file_the_line_and_the_value(lines, message):
    with pytest.raises(TraceError, match="^" + re.escape(message)):
        read_trace(lines, "t.csv")


def test_the_schedule_divides_the_offsets_by_the_rate_multiple_within_the_duration():
    trace = [TraceRequest(at, 10, 5) for at in (0.0, 4.0, 10.0)]
    assert [at for at, _ in schedule(trace, 2.0, duration_s=5.0)] == [0.0, 2.0]
    assert [at for at, _ in schedule(trace, 0.5, duration_s=None)] == [0.0, 8.0, 20.0]
    with pytest.raises(ValueError, match="rate multiple must be > 0, got 0"):
        schedule(trace, 0.0, None)


@pytest.mark.parametrize("tokens", [1, 2, 100, 1021])
def test_the_router_estimates_a_prompt_at_the_trace_s_context_tokens(tokens):
    prompt = prompt_of(tokens)
    assert prompt.isascii()
    assert estimate_input_tokens({"prompt": prompt}) == tokens


def test_times_with_offsets_are_ordered_in_utc():
    lines = [
        HEADER,
        "2023-11-16T18:00:05+01:00,1,1\n",
        "2023-11-16T17:00:00Z,2,2\n",
        "2023-11-16T12:00:10-05:00,3,3\n",
    ]
    assert [(r.at_s, r.context_tokens) for r in read_trace(lines, "t.csv")] == [(0.0, 2), (5.0, 1), (10.0, 3)]
