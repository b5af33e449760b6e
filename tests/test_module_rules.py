"""The size rules a newcomer relies on: a module docstring is at most 30 lines (one paragraph,
details in docs/), and no module of the product (outside tests/, bench/ and migrations) is over
700 lines. Modules still over it are listed in OVERSIZED, to be split; the list may only shrink:
a module listed that is no longer over fails too, so that its entry goes."""

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCSTRING_LINES_MAX = 30
MODULE_LINES_MAX = 700
OVERSIZED: set[str] = set()


def python_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


def long_docstrings(files: dict[str, str]) -> list[str]:
    found = []
    for name, source in files.items():
        doc = ast.get_docstring(ast.parse(source, name), clean=False)
        if doc is not None and len(doc.splitlines()) > DOCSTRING_LINES_MAX:
            found.append(f"{name}: {len(doc.splitlines())} lines")
    return found


def long_modules(files: dict[str, str]) -> set[str]:
    return {
        name
        for name, source in files.items()
        if not name.startswith(("tests/", "bench/"))
        and "/migrations/" not in name
        and len(source.splitlines()) > MODULE_LINES_MAX
    }


pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")


def test_no_module_docstring_runs_over_30_lines():
    assert long_docstrings({name: (ROOT / name).read_text() for name in python_files()}) == []


def test_no_module_runs_over_700_lines_but_those_listed_to_split():
    assert long_modules({name: (ROOT / name).read_text() for name in python_files()}) == OVERSIZED


def test_the_rules_catch_a_long_docstring_and_a_long_module():
    essay = '"""' + "\n".join(["line"] * 31) + '"""\n'
    short = '"""One paragraph."""\n'
    files = {
        "capacity/essay.py": essay,
        "capacity/long.py": short + "x = 1\n" * 700,
        "tests/long.py": "x = 1\n" * 800,
    }
    assert long_docstrings(files) == ["capacity/essay.py: 31 lines"]
    assert long_modules(files) == {"capacity/long.py"}
