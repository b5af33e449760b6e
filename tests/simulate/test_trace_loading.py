"""Trace CSVs: the Azure format, a clear error for a bad row, amplify and time-scale."""

import random

import pytest

from capacity.simulate.arrivals import _lognormal
from capacity.simulate.traces import (
    Arrival,
    Trace,
    TraceError,
    amplify,
    diurnal,
    load,
    per_minute_counts,
    save,
    time_scale,
)

GOOD = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:16:46.6805900,10,0\n"
)


def test_load_reads_the_azure_format(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(GOOD)
    trace = load(str(path))
    assert [round(a.time_s, 6) for a in trace] == [0.0, 4.314579, 60.0]
    assert (trace[0].prompt_tokens, trace[0].output_tokens) == (374, 44)
    assert trace[2].output_tokens == 1  # 0 generated tokens still costs a step


def test_load_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(GOOD + "2023-11-16 18:17:00.0,many,3\n")
    with pytest.raises(TraceError, match=r"bad\.csv:5: bad row"):
        load(str(path))
    path.write_text(GOOD + "2023-11-16 18:17:00.0,3000000000,3\n")  # over a 32-bit column
    with pytest.raises(TraceError, match=r"bad\.csv:5: token count out of range"):
        load(str(path))
    path.write_text("time,in,out\n")
    with pytest.raises(TraceError, match=r":1: expected the header"):
        load(str(path))
    path.write_text(GOOD + "2023-11-16 18:17:00.0,300\n")
    with pytest.raises(
        TraceError, match=r"bad\.csv:5: expected 3 columns \(TIMESTAMP,ContextTokens,GeneratedTokens\)"
    ):
        load(str(path))
    path.write_bytes(GOOD.encode() + b"2023-11-16 18:17:00.0,3\xe9,3\n")  # Latin-1, not UTF-8
    with pytest.raises(
        TraceError, match=r"bad\.csv:5: not UTF-8 text \(invalid continuation byte at byte 23 "
    ):
        load(str(path))


def test_load_reads_a_spreadsheet_s_csv_with_its_byte_order_mark_and_crlf(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.replace("\n", "\r\n").encode())
    assert load(str(path)) == load(str(_written(tmp_path, GOOD)))


def _written(tmp_path, text):
    path = tmp_path / "plain.csv"
    path.write_text(text)
    return path


def test_amplify_and_time_scale():
    trace = [Arrival(float(k), 100, 10) for k in range(1000)]
    assert len(amplify(trace, 3.0)) == 3000
    thinned = amplify(trace, 0.5, seed=1)
    assert 450 <= len(thinned) <= 550 and thinned == amplify(trace, 0.5, seed=1)
    jittered = amplify(trace, 2.0, jitter_s=1.0)
    assert all(0 <= b.time_s - a.time_s < 1.0 for a, b in zip(jittered[::2], jittered[1::2], strict=True))
    assert [a.time_s for a in time_scale(trace[:3], 60.0)] == [0.0, 1 / 60, 2 / 60]
    with pytest.raises(ValueError, match="amplify factor"):
        amplify(trace, 0.0)


def test_synthetic_diurnal_peaks_at_ten_times_the_mean_and_round_trips(tmp_path):
    trace = diurnal(seed=3, seconds=1800.0, base_qps=2.0)
    counts = per_minute_counts(trace)
    assert 7.0 <= max(counts) / (sum(counts) / len(counts)) <= 13.0
    path = tmp_path / "d.csv"
    save(trace, str(path))
    again = load(str(path))
    assert len(again) == len(trace)
    assert again[-1].time_s == pytest.approx(trace[-1].time_s - trace[0].time_s, abs=1e-5)


def test_a_trace_is_three_columns_read_as_arrivals():
    trace = Trace([Arrival(0.0, 5, 6), Arrival(1.5, 7, 8), Arrival(2.0, 9, 10)])
    assert trace[1] == Arrival(1.5, 7, 8) and trace[-1].output_tokens == 10
    assert list(trace) == [Arrival(0.0, 5, 6), Arrival(1.5, 7, 8), Arrival(2.0, 9, 10)]
    tail = trace[1:]
    assert isinstance(tail, Trace) and tail == [Arrival(1.5, 7, 8), Arrival(2.0, 9, 10)]
    assert tail != trace and trace != [Arrival(0.0, 5, 6)]
    # 16 bytes an arrival (8 + 4 + 4): a day of a 200-replica fleet, ~10^8 arrivals, in 1.6 GB
    assert trace.times.itemsize + trace.prompts.itemsize + trace.outputs.itemsize == 16


def test_the_generator_draws_what_the_standard_library_would():
    # arrivals._lognormal writes out random.lognormvariate (Python 3.11) for speed: same seed,
    # same numbers, so a seed names the same trace either way.
    ours, stdlib = random.Random(5), random.Random(5)
    assert [_lognormal(ours.random, 1.0, 0.8) for _ in range(1000)] == [
        stdlib.lognormvariate(1.0, 0.8) for _ in range(1000)
    ]
