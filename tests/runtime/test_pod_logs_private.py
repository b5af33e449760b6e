"""A pod's log is its user's alone, whatever umask the agent was started under."""

import os
import stat
import sys
from pathlib import Path

from dataplane.runtime.pod_process import log_path, start_in_own_session


def test_a_pods_log_and_its_folder_have_no_group_or_other_bits(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = log_path(str(tmp_path / "pods"), "summarize-1")
        assert path is not None
        proc = start_in_own_session([sys.executable, "-c", "print('engine says hi')"], dict(os.environ), path)
        assert proc.wait(timeout=30) == 0
    finally:
        os.umask(old)
    assert Path(path).read_text() == "engine says hi\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "pods").st_mode) == 0o700
