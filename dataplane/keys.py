"""API keys for the data plane's processes: from an environment variable or a file, never argv.

A process's arguments are readable by every user of the machine (``ps``, /proc/<pid>/cmdline);
its environment and a mode-600 file are not. So each process that holds a key takes it from
``--<flag>-file PATH`` or ``$<VARIABLE>``, and refuses ``--<flag> VALUE`` with a message that
says where to put the key instead (one rule, for the router, the cluster agent, the pods and the
load generator).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any


def refused(message: str) -> type[argparse.Action]:
    """An argparse action that refuses its flag with ``message`` (a CommandError under Django's
    call_command, "error: ..." and exit 2 from a shell): for a secret that must not be on argv."""

    class Refused(argparse.Action):
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: str | Sequence[Any] | None,
            option_string: str | None = None,
        ) -> None:
            parser.error(message)

    return Refused


def add_key_arguments(parser: argparse.ArgumentParser, flag: str, variable: str, what: str) -> None:
    """``flag`` (e.g. "--key") is refused; ``flag-file`` names a file holding the key."""
    on_argv = (
        f"{flag} puts the {what} on the command line, where every user of the machine can "
        f"read it (ps); pass it in ${variable} or in a file: {flag}-file PATH"
    )
    parser.add_argument(flag, action=refused(on_argv), help=f"refused: use ${variable} or {flag}-file")
    parser.add_argument(
        flag + "-file",
        dest=flag.removeprefix("--").replace("-", "_") + "_file",
        metavar="PATH",
        default=None,
        help=f"a file holding the {what} (else ${variable})",
    )


def read_key(path: str | None, variable: str) -> str | None:
    """The key in ``path`` (surrounding whitespace stripped), else ``$variable``, else None.
    Raises ValueError naming the file when it cannot be read or is empty."""
    if path is None:
        return os.environ.get(variable) or None
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the key file {path}: {exc}") from None
    if not key:
        raise ValueError(f"the key file {path} is empty")
    return key


def read_private_file(path: str, what: str) -> str:
    """The secret in ``path`` (surrounding whitespace stripped), which only its owner may read:
    a file that group or others can read (mode 0644, say) is refused, since another user of the
    machine could have taken the secret from it. Raises ValueError naming the file and why."""
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode & 0o777
            if mode & 0o077:
                raise ValueError(
                    f"the {what} file {path} is readable by group or others (mode {mode:04o}): chmod 600 it"
                )
            secret = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the {what} file {path}: {exc}") from None
    if not secret:
        raise ValueError(f"the {what} file {path} is empty")
    return secret


def read_fleet_keys(path: str | None, variable: str) -> list[str]:
    """The fleet keys in ``path`` or ``$variable``, one a line: the key to send, then, during a
    rotation, the key it replaces (tried when a pod answers 401); [] without any. The file must
    be private (``read_private_file``), and each key a bearer token a header can carry. Raises
    ValueError naming the file (or the variable)."""
    if path is not None:
        text = read_private_file(path, "fleet key")
        where = f"the fleet key file {path}"
    else:
        text = os.environ.get(variable, "")
        where = f"${variable}"
    keys = [line.strip() for line in text.splitlines() if line.strip()]
    if len(keys) > 2:
        raise ValueError(f"{where} holds {len(keys)} keys: at most two (the new one, then the old one)")
    for key in keys:
        if not (key.isascii() and key.isprintable() and " " not in key):
            raise ValueError(f"{where} holds characters an HTTP header cannot carry (one key a line)")
    return keys
