"""The prober credential comes from a file or the environment, never a flag's value."""

import pytest

from dataplane.router.__main__ import parse_args, probe_key


def test_the_credential_is_read_from_the_file_else_the_environment(tmp_path, monkeypatch):
    key_file = tmp_path / "probe-key"
    key_file.write_text("  s3cret\n")
    assert probe_key(str(key_file), "from-env") == b"s3cret"  # the file wins
    assert probe_key(None, "from-env\n") == b"from-env"
    assert probe_key(None, None) is None and probe_key(None, "") is None  # no probes at all
    monkeypatch.setenv("ROUTER_PROBE_KEY", "env-key")
    assert parse_args(["--backends", "http://127.0.0.1:1"]).probe_key == b"env-key"


def test_an_empty_or_missing_key_file_stops_the_router_naming_it(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for path in (str(empty), str(tmp_path / "missing")):
        with pytest.raises(SystemExit):
            parse_args(["--backends", "http://127.0.0.1:1", "--probe-key-file", path])
        assert path in capsys.readouterr().err
