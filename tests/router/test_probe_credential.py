"""The prober credential comes from a file or the environment, never a flag's value."""

import pytest

from dataplane.router.__main__ import parse_args


def test_the_credential_is_read_from_the_file_else_the_environment(tmp_path, monkeypatch):
    key_file = tmp_path / "probe-key"
    key_file.write_text("  s3cret\n")
    static = ["--backends", "http://127.0.0.1:1"]
    monkeypatch.delenv("ROUTER_PROBE_KEY", raising=False)
    assert parse_args(static).probe_key is None  # no credential: no request is a probe
    monkeypatch.setenv("ROUTER_PROBE_KEY", "env-key")
    assert parse_args(static).probe_key == b"env-key"
    assert parse_args([*static, "--probe-key-file", str(key_file)]).probe_key == b"s3cret"  # the file wins


def test_an_empty_or_missing_key_file_stops_the_router_naming_it(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for path in (str(empty), str(tmp_path / "missing")):
        with pytest.raises(SystemExit):
            parse_args(["--backends", "http://127.0.0.1:1", "--probe-key-file", path])
        assert path in capsys.readouterr().err
