"""The docs site and the rules a reader of the repository relies on: the site builds with
`mkdocs build --strict` (a broken link or anchor fails), every page under docs/ is in its
navigation, every environment variable the settings read is documented, the command-line
and autoscaler references (docs/cli.md, docs/autoscaler-options.md) are what the code says and
give every flag and option a meaning, and
no tracked file points at an issue by number. Each check is also run on a broken input and must
catch it."""

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).parent / "mkdocs"
ISSUE_REFERENCE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
SETTING = re.compile(r"\benv(?:str|bool|int|float|list|database)\(\s*\"([A-Z][A-Z0-9_]*)\"")


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def docs_copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", root / "docs")
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    return root


def test_the_site_builds_strictly():
    out = build(ROOT, ROOT / "build" / "site-test")
    assert out.returncode == 0, out.stderr


def test_a_broken_link_fails_the_build(tmp_path):
    root = docs_copy(tmp_path)
    with (root / "docs" / "api.md").open("a") as f:
        f.write("\nSee [the missing page](no-such-page.md).\n")
    out = build(root, tmp_path / "site")
    assert out.returncode != 0 and "no-such-page.md" in out.stderr


def test_a_page_left_out_of_the_navigation_fails_the_build(tmp_path):
    root = docs_copy(tmp_path)
    (root / "docs" / "orphan.md").write_text("# Orphan\n")
    out = build(root, tmp_path / "site")
    assert out.returncode != 0 and "orphan.md" in out.stderr


def undocumented_settings(settings: str, docs: list[str]) -> list[str]:
    """Variables read in the settings' source that no docs page names."""
    text = "\n".join(docs)
    return sorted({v for v in SETTING.findall(settings) if not re.search(rf"\b{v}\b", text)})


def test_every_setting_is_documented():
    docs = [p.read_text() for p in (ROOT / "docs").rglob("*.md")]
    assert undocumented_settings((ROOT / "controlplane" / "settings.py").read_text(), docs) == []


def test_an_undocumented_setting_is_caught():
    settings = (
        'A = envint("KNOWN_KNOB_S", 5)\nB = envbool(\n    "NEW_KNOB", False)\nC = envstr("KNOWN_KNOB")\n'
    )
    docs = ["| `KNOWN_KNOB_S` | 5 | ... |", "`KNOWN_KNOB` is ..."]
    assert undocumented_settings(settings, docs) == ["NEW_KNOB"]


@pytest.mark.stack
def test_the_references_are_what_the_code_says():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "reference.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def flags_without_meaning(page: str) -> list[str]:
    """The flags of a reference table ("| flag | type | default | meaning |") with no meaning."""
    rows = [line.split(" | ") for line in page.splitlines() if line.startswith("| `")]
    return [row[0].lstrip("| ") for row in rows if row[-1].strip(" |") == ""]


def test_every_flag_and_autoscaler_option_has_a_meaning():
    for page in ("cli.md", "autoscaler-options.md"):
        assert flags_without_meaning((ROOT / "docs" / page).read_text()) == [], page


def test_a_flag_without_a_meaning_is_caught():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=80, help="where it listens (default %(default)s)")
    parser.add_argument("--mystery", type=float, default=1.5)
    rows = reference._flag_rows(parser)
    assert rows[0] == "| `--port` | int | `80` | where it listens (default 80) |"
    assert flags_without_meaning("\n".join(rows)) == ["`--mystery`"]


def issue_references(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, IsADirectoryError):
            continue  # binary files (screenshots)
        found += [f"{path}: {m.group(0)}" for m in ISSUE_REFERENCE.finditer(text)]
    return found


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_tracked_file_names_an_issue_by_number():
    assert issue_references(tracked_files()) == []


def test_an_issue_number_is_caught(tmp_path):
    note = tmp_path / "note.md"
    number = 12  # not written out: this file would name an issue itself
    note.write_text(f"Fixed as issue {number} asked.\n")
    assert issue_references([note]) == [f"{note}: issue {number}"]
