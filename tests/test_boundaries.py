"""Imports point one way (shared/DESIGN.md, "Where things live"):

    capacity.units (the MU price rule; imports nothing of ours)
      <- engine_model (the engine's performance model; of ours, imports only capacity.units)
      <- dataplane (its only import of capacity is capacity.units; may use engine_model)
      <- capacity (the pure library; may use engine_model and dataplane's pure modules)
      <- controlplane (Django)

No module under capacity/, dataplane/ or engine_model/ imports django, rest_framework, celery or controlplane:
checked twice, by reading every file's import statements (wherever they stand, function bodies
included) and by importing every module in a fresh interpreter. Both checks are also run on a
copy of the tree with a forbidden import slipped in, and must catch it.

Within controlplane the Django apps are ordered tenants < capacity < endpoints < oncall, and
everything else of controlplane (selling, scaling, rollouts, profile_benchmarks, tasks, api,
console, ...) stands above all four: no module of an app, its migrations and management
commands included, imports a later app or anything above them, at module or function level
(read from the import statements, as above). A lower app that must set off something in a
higher one sends a signal the higher one connects in its AppConfig.ready() (tenants'
key_revoked, which endpoints answers by withdrawing the routing table). Nor does an app's
migration depend on a later app's, or read its models, but for the capacity migrations already
applied before the order was kept (KNOWN_MIGRATION_ARROWS: the reservation's endpoint). This
check too is run on a copy of the tree with an upward import slipped in.
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
PURE_PACKAGES = ("capacity", "dataplane", "engine_model")
FORBIDDEN = ("django", "rest_framework", "celery", "controlplane")
GROUND_FLOOR = "capacity.units"
OURS = ("capacity", "dataplane", "engine_model", "controlplane")
APPS = ("tenants", "capacity", "endpoints", "oncall")  # controlplane's apps, the lowest first
# Applied before the order was kept, so they stay: capacity's Reservation has a one-to-one field
# to endpoints.Endpoint (0002 adds it, 0005 makes it PROTECT), and 0006 read each pool's
# endpoints to give the pool its node shape. Editing them would change existing databases' graph.
KNOWN_MIGRATION_ARROWS = [
    "controlplane.capacity.migrations.0002_initial depends on endpoints.0001_initial",
    "controlplane.capacity.migrations.0005_reservation_protects_its_endpoint depends on"
    " endpoints.0010_endpoint_clamped_since",
    "controlplane.capacity.migrations.0006_pool_node_shape depends on endpoints.0010_endpoint_clamped_since",
    "controlplane.capacity.migrations.0006_pool_node_shape reads endpoints.Endpoint",
]


def modules(root: Path, packages: tuple[str, ...] = PURE_PACKAGES) -> dict[str, Path]:
    """Every module of `packages` (directories under `root`; the pure ones unless named), by dotted name."""
    found = {}
    for package in packages:
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
            elif (
                root_of(module) == "engine_model"
                and ours
                and root_of(name) != "engine_model"
                and not (name == GROUND_FLOOR or name.startswith(GROUND_FLOOR + "."))
                and name != "capacity"
            ):
                bad.append(
                    f"{module} imports {name} (the engine model may import only {GROUND_FLOOR} of ours)"
                )
    return bad


def app_rank(name: str) -> int | None:
    """Where a module of controlplane stands: its app's place in APPS, len(APPS) for the rest of
    controlplane (above every app); None for what is not controlplane's, and for the package
    itself (controlplane/__init__.py, which every module of it loads anyway)."""
    parts = name.split(".")
    if parts[0] != "controlplane" or len(parts) == 1:
        return None
    return APPS.index(parts[1]) if parts[1] in APPS else len(APPS)


def upward_imports(root: Path) -> list[str]:
    """'module imports name (...)' for each import, by a module of one of APPS, of a later app or
    of the rest of controlplane: wherever it stands, function bodies included."""
    bad = []
    app_dirs = tuple(f"controlplane/{app}" for app in APPS)
    for module, path in modules(root, app_dirs).items():
        rank = app_rank(module)
        assert rank is not None and rank < len(APPS), module
        for name in sorted(imported_names(path, module)):
            theirs = app_rank(name)
            if theirs is not None and theirs > rank:
                where = f"{APPS[theirs]} is after {APPS[rank]}" if theirs < len(APPS) else "above the apps"
                bad.append(f"{module} imports {name} ({where})")
    return bad


def upward_migrations(root: Path) -> list[str]:
    """Each dependency of an app's migration on a later app's ('... depends on endpoints.0001_initial'),
    and each model of a later app it reads through apps.get_model ('... reads endpoints.Endpoint')."""
    bad = []
    for module, path in modules(root, tuple(f"controlplane/{app}/migrations" for app in APPS)).items():
        rank = APPS.index(module.split(".")[1])
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "dependencies" for target in node.targets
            ):
                for dependency in getattr(node.value, "elts", []):  # swappable_dependency(...): not an app's
                    if isinstance(dependency, ast.Tuple) and all(
                        isinstance(e, ast.Constant) for e in dependency.elts
                    ):
                        label, name = (e.value for e in dependency.elts)
                        if label in APPS and APPS.index(label) > rank:
                            bad.append(f"{module} depends on {label}.{name}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get_model"
                and len(node.args) == 2
                and all(isinstance(a, ast.Constant) for a in node.args)
            ):
                label, model = (a.value for a in node.args)
                if label in APPS and APPS.index(label) > rank:
                    bad.append(f"{module} reads {label}.{model}")
    return sorted(bad)


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


@pytest.mark.stack
def test_importing_every_pure_module_loads_no_django():
    assert loaded_forbidden(ROOT) == []


@pytest.mark.stack
@pytest.mark.parametrize(
    "path, module",
    [
        ("dataplane/router/balancer.py", "dataplane.router.balancer"),
        ("capacity/fitting.py", "capacity.fitting"),
        ("engine_model/perf_model.py", "engine_model.perf_model"),
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


def test_the_checks_catch_an_engine_model_import_of_the_data_plane(tmp_path):
    for package in PURE_PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "engine_model/perf_model.py").open("a") as f:
        f.write("\nfrom dataplane.runtime import sim\n")
    only = "(the engine model may import only capacity.units of ours)"
    assert import_violations(tmp_path) == [
        f"engine_model.perf_model imports dataplane.runtime {only}",
        f"engine_model.perf_model imports dataplane.runtime.sim {only}",
    ]


def test_no_app_imports_a_later_app_or_what_stands_above_the_apps():
    assert upward_imports(ROOT) == []


def test_no_app_migration_depends_on_a_later_app_but_those_already_applied():
    assert upward_migrations(ROOT) == KNOWN_MIGRATION_ARROWS


def copy_of_the_control_plane(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "controlplane", tmp_path / "controlplane", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path


@pytest.mark.parametrize(
    "path, module, statement, found",
    [
        (
            "controlplane/capacity/models.py",
            "controlplane.capacity.models",
            "def _x():\n    from controlplane.endpoints import models\n",
            [
                "controlplane.endpoints (endpoints is after capacity)",
                "controlplane.endpoints.models (endpoints is after capacity)",
            ],
        ),
        (
            "controlplane/tenants/models.py",
            "controlplane.tenants.models",
            "def _x():\n    import controlplane.selling\n",
            ["controlplane.selling (above the apps)"],
        ),
        (
            "controlplane/endpoints/routing.py",
            "controlplane.endpoints.routing",
            "from ..oncall.models import Event\n",
            [
                "controlplane.oncall.models (oncall is after endpoints)",
                "controlplane.oncall.models.Event (oncall is after endpoints)",
            ],
        ),
    ],
)
def test_the_check_catches_an_upward_import_slipped_in(tmp_path, path, module, statement, found):
    root = copy_of_the_control_plane(tmp_path)
    with (root / path).open("a") as f:
        f.write("\n\n" + statement)
    assert upward_imports(root) == [f"{module} imports {name}" for name in found]


def test_the_check_catches_a_migration_that_depends_on_a_later_app(tmp_path):
    root = copy_of_the_control_plane(tmp_path)
    (root / "controlplane/tenants/migrations/0004_x.py").write_text(
        "from django.db import migrations\n\n\n"
        "def fill(apps, schema_editor):\n"
        '    apps.get_model("oncall", "Event")\n\n\n'
        "class Migration(migrations.Migration):\n"
        '    dependencies = [("tenants", "0003_tenant_gpu_quota"), ("oncall", "0005_list_indexes")]\n'
        "    operations = [migrations.RunPython(fill)]\n"
    )
    assert upward_migrations(root) == [
        *KNOWN_MIGRATION_ARROWS,
        "controlplane.tenants.migrations.0004_x depends on oncall.0005_list_indexes",
        "controlplane.tenants.migrations.0004_x reads oncall.Event",
    ]
