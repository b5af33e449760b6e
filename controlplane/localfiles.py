"""The embedded stack's files under var/, for the stack's user alone.

The embedded default keeps its SQLite database, broker files, logs, keys and its secret key in one
folder (CONTROLPLANE_VAR_DIR). ``private_var_dir`` sets the process's umask to 077, so that
everything it writes there (the database and its -wal/-journal files, the broker's files, logs)
is made 600 and 700, and takes the group and other bits off the folder itself, for a var/ made
755 by an older run; ``local_secret_key`` makes the secret key that signs sessions once, mode
600, and reads it back at every start, so that sessions survive a restart.
"""

import os
import secrets
import stat
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

PRIVATE_UMASK = 0o077
SECRET_KEY_FILE = "secret_key"


def private_var_dir(var_dir: Path) -> None:
    """Make the process's files private and var_dir (made if missing) 700."""
    os.umask(PRIVATE_UMASK)
    try:
        var_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if stat.S_IMODE(var_dir.stat().st_mode) & 0o077:
            var_dir.chmod(0o700)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"CONTROLPLANE_VAR_DIR={str(var_dir)!r} cannot be made private to this user: {exc}"
        ) from None


def local_secret_key(var_dir: Path) -> str:
    """The secret key in var_dir/secret_key: made once (600) by whichever process comes first."""
    path = var_dir / SECRET_KEY_FILE
    try:
        var_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.exists():
            _write_once(path, secrets.token_urlsafe(50))
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            path.chmod(0o600)
        key = path.read_text().strip()
    except OSError as exc:
        raise ImproperlyConfigured(
            f"the local secret key {str(path)!r} cannot be made or read ({exc}); "
            "set SECRET_KEY, or CONTROLPLANE_VAR_DIR to a folder this user may write"
        ) from None
    if len(key) < 50:
        raise ImproperlyConfigured(
            f"the local secret key {str(path)!r} is {len(key)} characters (50+ needed): "
            "delete it to have a new one made (signed-in sessions end), or set SECRET_KEY"
        )
    return key


def _write_once(path: Path, key: str) -> None:
    # Written whole under a name of its own, then linked into place: the web server, the worker
    # and manage.py start together, and a reader sees either no file or the whole key; the
    # link fails for all but the first, which keep the key already there.
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(key + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
    finally:
        draft.unlink(missing_ok=True)
