"""One frozen config: defaults are sane, bad values name the key."""

import dataclasses

import pytest

from dataplane.router.__main__ import build_config, parse_args
from dataplane.router.config import RouterConfig


def test_defaults_are_frozen_and_valid():
    c = RouterConfig()
    assert c.max_body_bytes == 4 * 1024 * 1024 and c.queue_wait_s == 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.queue_wait_s = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"queue_wait_s": -1}, "queue_wait_s"),
        ({"write_low_water_bytes": 10, "write_high_water_bytes": 5}, "write_low_water_bytes"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"metrics_ttl_s": 120}, "metrics_ttl_s"),  # under the collector's catch-up: lost buckets
    ],
)
def test_bad_values_name_the_key(kw, name):
    with pytest.raises(ValueError, match=name):
        RouterConfig(**kw)


def test_command_line_overrides_any_field():
    args = parse_args(
        [
            "--listen",
            "127.0.0.1:1",
            "--backends",
            "http://127.0.0.1:2",
            "--queue-wait-s",
            "0.5",
            "--max-body-bytes",
            "1000",
        ]
    )
    c = build_config(args)
    assert c.queue_wait_s == 0.5 and c.max_body_bytes == 1000 and c.drain_timeout_s == 30.0


def test_control_plane_mode_needs_a_key(monkeypatch):
    monkeypatch.delenv("ROUTER_KEY", raising=False)
    with pytest.raises(SystemExit):
        parse_args(["--control-plane", "http://127.0.0.1:8000"])
