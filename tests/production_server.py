"""The production web server as the image runs it, for tests that start it: the Dockerfile's last
CMD, its bind moved to 127.0.0.1, against the test PostgreSQL."""

import json
import shutil
import sys
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "controlplane.Dockerfile"


def image_command() -> list[str]:
    """The last CMD of the Dockerfile, which must be a JSON array."""
    cmds = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("CMD ")]
    assert cmds, "the Dockerfile has no CMD"
    command = json.loads(cmds[-1].removeprefix("CMD "))
    assert isinstance(command, list) and all(isinstance(arg, str) for arg in command)
    return command


def rebound(command: list[str], port: int) -> list[str]:
    """The command with its --bind on 127.0.0.1:port and its program from this interpreter's venv."""
    at = command.index("--bind") + 1
    program = shutil.which(command[0], path=str(Path(sys.executable).parent)) or command[0]
    return [program, *command[1:at], f"127.0.0.1:{port}", *command[at + 1 :]]


def database_url() -> str:
    db = connection.settings_dict
    assert db["ENGINE"] == "django.db.backends.postgresql", "runs against the test PostgreSQL"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
