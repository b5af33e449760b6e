"""The stale-table rule alone (time passed in), and its settings on the command line. With a
real control plane and router: tests/test_router_table_freshness.py."""

import pytest

from dataplane.router.__main__ import build_config, parse_args
from dataplane.router.config import RouterConfig
from dataplane.router.control_plane import TableFreshness
from dataplane.router.http import RequestError

WALL = 1_764_590_400.0  # 2025-12-01T12:00:00Z


def test_keys_pass_up_to_the_bound_and_are_refused_past_it():
    f = TableFreshness(600.0, fail_open=False)
    f.check(10_000.0, WALL)  # never confirmed (static mode): never stale
    f.confirm(100.0)
    f.check(700.0, WALL)  # exactly the bound: still fresh
    with pytest.raises(RequestError) as refused:
        f.check(701.0, WALL)
    assert refused.value.status == 503 and refused.value.code == "routing_table_stale"
    assert refused.value.message.startswith("routing table stale since 2025-12-01T11:49:59+00:00")
    assert (f.served_stale, f.refused_stale) == (0, 1)
    f.confirm(702.0)  # a 304 again
    f.check(702.5, WALL)
    assert f.age_s(703.0) == 1.0


def test_fail_open_serves_and_counts_and_zero_never_goes_stale():
    f = TableFreshness(600.0, fail_open=True)
    f.confirm(0.0)
    f.check(601.0, WALL)
    f.check(602.0, WALL)
    assert (f.served_stale, f.refused_stale) == (2, 0)
    assert 'router_stale_table_requests_total{outcome="served"} 2' in f.metrics_text(602.0)
    assert "router_routing_table_age_seconds 602.0" in f.metrics_text(602.0)
    never = TableFreshness(0.0, fail_open=False)
    never.confirm(0.0)
    never.check(10**9, WALL)


def test_the_bound_and_the_mode_are_router_settings(monkeypatch, capsys):
    assert (RouterConfig().stale_table_after_s, RouterConfig().stale_table) == (600.0, "fail-closed")
    monkeypatch.setenv("ROUTER_KEY", "k")
    args = parse_args(
        ["--control-plane", "http://cp", "--stale-table-after-s", "30", "--stale-table", "fail-open"]
    )
    config = build_config(args)
    assert (config.stale_table_after_s, config.stale_table) == (30.0, "fail-open")
    with pytest.raises(SystemExit):
        parse_args(["--control-plane", "http://cp", "--stale-table", "fail-ajar"])
    assert (
        "RouterConfig.stale_table must be one of fail-closed, fail-open, got 'fail-ajar'"
        in capsys.readouterr().err
    )
