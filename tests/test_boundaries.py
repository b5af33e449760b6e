"""Imports point one way (shared/DESIGN.md, "Where things live"):

    capacity.units (the MU price rule; imports nothing of ours)
      <- dataplane (its only import of capacity is capacity.units)
      <- capacity (the pure library; may use dataplane's pure runtime models)
      <- controlplane (Django)

No module under capacity/ or dataplane/ imports django, rest_framework, celery or controlplane:
checked twice, by reading every file's import statements (wherever they stand, function bodies
included) and by importing every module in a fresh interpreter. Both checks are also run on a
copy of the tree with a forbidden import slipped in, and must catch it.
"""

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE_PACKAGES = ("capacity", "dataplane")
FORBIDDEN = ("django", "rest_framework", "celery", "controlplane")
GROUND_FLOOR = "capacity.units"
OURS = ("capacity", "dataplane", "controlplane")


def modules(root: Path) -> dict[str, Path]:
    """Every module of the pure packages under `root`, by dotted name."""
    found = {}
    for package in PURE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imported_names(path: Path, module: str) -> set[str]:
    """The modules a file imports, anywhere in it (relative imports resolved)."""
    names = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def root_of(name: str) -> str:
    return name.split(".")[0]


def import_violations(root: Path) -> list[str]:
    """'module imports name' for each import that breaks the direction above."""
    bad = []
    for module, path in modules(root).items():
        for name in sorted(imported_names(path, module)):
            ours = root_of(name) in OURS
            if root_of(name) in FORBIDDEN:
                bad.append(f"{module} imports {name}")
            elif module == GROUND_FLOOR and ours:
                bad.append(f"{module} imports {name} (the ground floor imports nothing of ours)")
            elif (
                root_of(module) == "dataplane"
                and root_of(name) == "capacity"
                and not (name == GROUND_FLOOR or name.startswith(GROUND_FLOOR + "."))
                and name != "capacity"
            ):
                bad.append(f"{module} imports {name} (the data plane may import only {GROUND_FLOOR})")
    return bad


def loaded_forbidden(root: Path) -> list[str]:
    """Import every module under `root` in a fresh interpreter; the forbidden modules it loaded."""
    names = [m for m in modules(root) if not m.endswith("__main__")]
    code = (
        "import importlib, json, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONSAFEPATH")}
    env["PYTHONPATH"] = str(root)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_no_pure_module_imports_the_control_plane_or_django():
    assert import_violations(ROOT) == []


def test_importing_every_pure_module_loads_no_django():
    assert loaded_forbidden(ROOT) == []


@pytest.mark.parametrize(
    "path, module",
    [
        ("dataplane/router/balancer.py", "dataplane.router.balancer"),
        ("capacity/fitting.py", "capacity.fitting"),
    ],
)
def test_the_checks_catch_a_django_import_slipped_in(tmp_path, path, module):
    for package in PURE_PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / path).open("a") as f:
        f.write("\nimport django.db\n")
    assert import_violations(tmp_path) == [f"{module} imports django.db"]
    assert "django.db" in loaded_forbidden(tmp_path)


def test_the_checks_catch_a_data_plane_import_of_the_capacity_library(tmp_path):
    for package in PURE_PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "dataplane/router/pricing.py").open("a") as f:
        f.write("\nfrom capacity.fitting import fit\n")
    only = "(the data plane may import only capacity.units)"
    assert import_violations(tmp_path) == [
        f"dataplane.router.pricing imports capacity.fitting {only}",
        f"dataplane.router.pricing imports capacity.fitting.fit {only}",
    ]
