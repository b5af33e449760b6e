"""Write the reference pages from the code: docs/cli.md, every command-line flag of the programs
the project runs, from the programs' own argument parsers, and docs/autoscaler-options.md,
every per-endpoint autoscaler option, from AutoscalerConfig's fields and their comments; each
with its type, default and meaning. `python scripts/reference.py` rewrites both, `--check`
exits 1 when a page is not what the code says (the test run checks it). Each parser is the one
its program builds when it starts: the program is called with no arguments and stopped at the
moment it parses them, before it does anything else."""

import argparse
import ast
import contextlib
import importlib
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLI_PAGE = ROOT / "docs" / "cli.md"
OPTIONS_PAGE = ROOT / "docs" / "autoscaler-options.md"
CONFIG = ROOT / "capacity" / "autoscaler" / "config.py"

# (how it is run, module, entry point: "parse_args" takes argv, "main" reads it or takes it)
PROGRAMS = [
    ("python -m dataplane.router", "dataplane.router.__main__", "parse_args"),
    ("python -m dataplane.cluster.agent", "dataplane.cluster.agent", "main"),
    ("python -m dataplane.runtime.pod", "dataplane.runtime.pod", "parse_args"),
    ("python -m dataplane.runtime.launcher", "dataplane.runtime.launcher", "main"),
    ("python -m dataplane.runtime.sim", "dataplane.runtime.sim", "parse_args"),
    ("python -m dataplane.runtime.warm", "dataplane.runtime.warm", "main"),
    ("python -m dataplane.loadgen", "dataplane.loadgen.__main__", "parse_args"),
    ("python -m capacity.simulate", "capacity.simulate.__main__", "main"),
    ("python -m capacity.simulate.traces", "capacity.simulate.traces", "main"),
    ("python -m controlplane.localstack.supervisor (make run)", "controlplane.localstack.supervisor", "main"),
]


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


@contextlib.contextmanager
def _stopped_at_parse() -> Iterator[None]:
    """Every ArgumentParser raises _Parsed (carrying itself) where it would parse."""

    def stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Parsed(self)

    parse_known_args = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = stop  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def program_parser(module: str, entry: str) -> argparse.ArgumentParser:
    call: Callable[..., Any] = getattr(importlib.import_module(module), entry)
    argv = sys.argv
    sys.argv = [module]
    try:
        with _stopped_at_parse():
            call([]) if entry == "parse_args" else call()
    except _Parsed as parsed:
        return parsed.parser
    finally:
        sys.argv = argv
    raise RuntimeError(f"{module}.{entry} parsed no arguments")


def django_commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """The project's own manage.py commands (not Django's or the libraries')."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django
    from django.core.management import get_commands, load_command_class

    django.setup()
    commands = get_commands()
    ours = sorted(name for name, app in commands.items() if app.split(".")[0] == "controlplane")
    return [
        (f"python manage.py {n}", load_command_class(commands[n], n).create_parser("manage.py", n))
        for n in ours
    ]


_KEPT_ENVIRONMENT = {"PATH", "HOME", "LANG", "PYTHONPATH"}

# Options every Django command has: documented by Django, not here.
_DJANGO_COMMON = {
    "--version", "--verbosity", "--settings", "--pythonpath", "--traceback", "--no-color",
    "--force-color", "--skip-checks",
}  # fmt: skip


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(value: Any) -> str:
    """A default as the page shows it: the same on every machine."""
    if value == sys.executable:
        return "this interpreter"
    if value == socket.gethostname():
        return "the host's name"
    return repr(value)


def _flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        names = action.option_strings or [action.dest]
        if set(names) & _DJANGO_COMMON:
            continue
        kind = getattr(action.type, "__name__", "") if action.type else ""
        if action.nargs == 0:
            kind, default = "switch", ""
        else:
            kind = kind or ("choice" if action.choices else "str")
            default = "" if action.default in (None, argparse.SUPPRESS) else _default(action.default)
            if action.required:
                default = "required"
        if action.choices and action.nargs != 0:
            kind += ": " + ", ".join(str(c) for c in action.choices)
        flags = ", ".join(f"`{n}`" for n in names)
        meaning = (action.help or "") % {**vars(action), "prog": parser.prog}  # as --help expands it
        default = _cell(default) and f"`{_cell(default)}`"
        rows.append(f"| {flags} | {_cell(kind)} | {default} | {_cell(meaning)} |")
    return rows


def render_cli() -> str:
    out = [
        "# Command-line reference",
        "",
        "Every flag of every program the project runs, from the programs' own parsers (generated by",
        "`python scripts/reference.py`; the test run fails when this page and the code differ).",
        "Keys are never flags with a value: each program that holds one takes it from a file or the",
        "environment and refuses it on the command line (`dataplane/keys.py`). The settings read",
        "from the environment are on [Settings](settings.md); the `make` targets on",
        "[Commands](commands.md).",
    ]
    parsers = [(run, program_parser(module, entry)) for run, module, entry in PROGRAMS] + django_commands()
    for run, parser in parsers:
        description = (parser.description or "").strip().split("\n\n")[0]
        out += ["", f"## `{run}`", ""]
        if description:
            out += [" ".join(description.split()), ""]
        out += ["| flag | type | default | meaning |", "|---|---|---|---|", *_flag_rows(parser)]
    return "\n".join(out) + "\n"


def option_rows(source: str) -> list[tuple[str, str, str, str]]:
    """AutoscalerConfig's fields as (name, type, default, meaning): the meaning is the comment
    above the field (back to the previous field or section line) and the one after it."""
    lines = source.splitlines()
    (config,) = (
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "AutoscalerConfig"
    )
    rows = []
    for field in config.body:
        if not (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)):
            continue
        above = []
        i = field.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#") and not lines[i].strip().startswith("# ---"):
            above.insert(0, lines[i].strip().lstrip("#").strip())
            i -= 1
        after = lines[field.end_lineno - 1].partition("  # ")[2].strip()
        meaning = " ".join(part for part in (" ".join(above), after) if part)
        default = ast.unparse(field.value) if field.value is not None else ""
        rows.append((field.target.id, ast.unparse(field.annotation), default, meaning))
    return rows


def render_options() -> str:
    from controlplane.autoscaler_config import CADENCE_SETTINGS

    out = [
        "# Autoscaler options",
        "",
        "What an endpoint's `autoscaler` object may set (`PATCH /api/v1/endpoints/{id}/` with",
        '`{"autoscaler": {"scale_down_window_s": 120}}`): every field of',
        "`capacity/autoscaler/config.py`'s `AutoscalerConfig`, its type, default and meaning, generated",
        "from the code by `python scripts/reference.py` (the test run fails when they differ). A bad",
        "key or value is a 400 naming both; how the deciders use them is on",
        "[the autoscaler](autoscaler.md). A ... in a meaning continues the option before it.",
        "",
        "| option | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for name, kind, default, meaning in option_rows(CONFIG.read_text()):
        if name in CADENCE_SETTINGS:
            meaning += f" Not per endpoint: the control plane's cadence, `{CADENCE_SETTINGS[name]}`."
        out.append(f"| `{name}` | {kind} | `{default}` | {_cell(meaning)} |")
    return "\n".join(out) + "\n"


def main() -> int:
    # Defaults read from the environment (a pod's $MU_* variables) would make the page this
    # shell's: the programs are asked with none of it.
    for name in [n for n in os.environ if n not in _KEPT_ENVIRONMENT]:
        del os.environ[name]
    pages = {CLI_PAGE: render_cli(), OPTIONS_PAGE: render_options()}
    if "--check" in sys.argv[1:]:
        stale = [page.name for page, text in pages.items() if not page.exists() or page.read_text() != text]
        if stale:
            print(f"{', '.join(stale)} differ from the code: run {Path(__file__).name}")
        return 1 if stale else 0
    for page, text in pages.items():
        page.write_text(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
