"""The test tiers: `make test-fast` leaves out the tests marked with tests/conftest.py's
SLOW_MARKERS, and a test that starts servers or processes must be one of them. The conftest's hook
marks the users of the process-starting fixtures (checked here on a generated test file through
pytester), modules that start processes themselves carry `pytestmark` (checked here by reading
every test module), and the Makefile's expression is the conftest's markers."""

import ast
import re
import tomllib
from pathlib import Path

from tests.conftest import PROCESS_FIXTURES, SLOW_MARKERS

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# Calls that start a server or a process: an engine, a router, a pod, a worker, or any of the
# project's programs (`subprocess.run([sys.executable, ...])`: manage.py, `python -m ...`). Short
# runs of a tool (git, promtool, kubectl, curl, mkdocs) stay in the fast tier.
PROCESS_CALLS = frozenset(
    {"Popen", "sim_engine", "router_process", "running_pod", "tiny_vllm_pod", "start_pod", "start_worker"}
)
RUN_CALLS = frozenset({"run", "check_output", "check_call", "call"})


def runs_the_interpreter(call: ast.Call) -> bool:
    """`subprocess.run([sys.executable, ...])` and the like: one of the project's programs."""
    argv = call.args[0] if call.args else None
    return isinstance(argv, ast.List) and bool(argv.elts) and ast.unparse(argv.elts[0]) == "sys.executable"


def makefile_variable(makefile: str, name: str) -> str:
    """A `NAME := value` of the Makefile, with the $(VARIABLES) in it expanded."""
    found = re.search(rf"^{name} := (.*)$", makefile, re.M)
    assert found, f"no {name} in the Makefile"
    return re.sub(r"\$\((\w+)\)", lambda m: makefile_variable(makefile, m.group(1)), found.group(1))


def recipe(makefile: str, target: str) -> str:
    found = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert found, f"no {target} target in the Makefile"
    return found.group(1)


def fast_tier_expression() -> str:
    """The -m expression `make test-fast` passes to pytest."""
    makefile = (ROOT / "Makefile").read_text()
    assert '-m "$(FAST_TIER)"' in recipe(makefile, "test-fast")
    return makefile_variable(makefile, "FAST_TIER")


def test_make_test_fast_leaves_out_exactly_the_slow_markers_and_make_test_none():
    assert fast_tier_expression() == f"not ({' or '.join(SLOW_MARKERS)})"
    makefile = (ROOT / "Makefile").read_text()
    assert makefile_variable(makefile, "SLOW_TIER") == " or ".join(SLOW_MARKERS)
    # `make test` runs both tiers, one beside the other: every test, once.
    full = recipe(makefile, "test")
    assert full.count("/pytest ") == 2, full
    assert '-m "$(SLOW_TIER)"' in full and '-m "$(FAST_TIER)"' in full, full
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {line.split(":")[0] for line in config["markers"]}
    assert set(SLOW_MARKERS) <= registered
    assert " -m " not in config["addopts"]  # a plain `pytest` runs every test


STAND_IN = """
@pytest.fixture
def {name}():
    yield "started"  # a stand-in: the hook goes by the fixture's name

def test_uses_{name}({name}):
    pass
"""

GENERATED = """
import pytest

{stand_ins}

@pytest.fixture
def stack(live_server):
    return live_server

def test_uses_it_through_another_fixture(stack):
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_in_process(n):
    pass
"""


CONFTEST = """
from tests.conftest import SLOW_MARKERS, pytest_collection_modifyitems


def pytest_configure(config):
    for marker in SLOW_MARKERS:  # registered, as pyproject.toml does
        config.addinivalue_line("markers", marker)
"""


def test_a_test_using_a_process_starting_fixture_is_left_out_of_the_fast_tier(pytester):
    # The generated tests run under tests/conftest.py's hook alone (none of its fixtures, no
    # Django), with the -m expression of `make test-fast`.
    pytester.makeconftest(CONFTEST)
    stand_ins = "\n".join(STAND_IN.format(name=name) for name in sorted(PROCESS_FIXTURES))
    pytester.makepyfile(test_generated=GENERATED.format(stand_ins=stand_ins))
    plugins = ("-p", "no:django", "-p", "no:locust", "-p", "no:schemathesis", "-p", "no:cacheprovider")
    slow = [f"test_uses_{name}" for name in sorted(PROCESS_FIXTURES)] + [
        "test_uses_it_through_another_fixture"
    ]

    fast = pytester.runpytest(*plugins, "-m", fast_tier_expression(), "-v")
    fast.assert_outcomes(passed=2, deselected=len(slow))
    fast.stdout.fnmatch_lines(["*::test_in_process[[]1[]] PASSED*", "*::test_in_process[[]2[]] PASSED*"])

    marked = pytester.runpytest(*plugins, "-m", "stack", "-v")
    marked.assert_outcomes(passed=len(slow), deselected=2)
    marked.stdout.fnmatch_lines([f"*::{test} PASSED*" for test in slow], consecutive=False)


def starts_processes(tree: ast.Module) -> dict[str, str]:
    """The module's test functions that start processes, directly or through one of the module's
    functions or fixtures: {test: the call}."""
    functions = {
        node.name: node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }

    def calls(function: ast.FunctionDef | ast.AsyncFunctionDef, seen: frozenset[str]) -> str | None:
        used = [arg.arg for arg in function.args.args]
        for node in ast.walk(function):
            if isinstance(node, ast.Call):
                called = node.func
                name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", None)
                if name in PROCESS_CALLS or (name in RUN_CALLS and runs_the_interpreter(node)):
                    return name
                if isinstance(name, str):
                    used.append(name)
        for name in used:
            if name in functions and name not in seen:
                found = calls(functions[name], seen | {name})
                if found:
                    return f"{name} -> {found}"
        return None

    found = {}
    for name, function in functions.items():
        if name.startswith("test"):
            call = calls(function, frozenset({name}))
            if call:
                found[name] = call
    return found


def slow_marks(decorators: list[ast.expr]) -> set[str]:
    """The slow markers among `@pytest.mark.X` decorators or a `pytestmark` value's marks."""
    marks = set()
    for node in decorators:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and sub.attr in SLOW_MARKERS:
                if isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                    marks.add(sub.attr)
    return marks


def is_pytestmark(node: ast.Assign) -> bool:
    return any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)


def test_every_test_that_starts_processes_carries_a_slow_marker():
    unmarked = []
    for path in sorted(TESTS.rglob("test_*.py")):
        name = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(), name)
        pytestmark = [n.value for n in tree.body if isinstance(n, ast.Assign) and is_pytestmark(n)]
        module_marks = slow_marks(pytestmark)
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        for test, call in starts_processes(tree).items():
            function = functions[test]
            through_fixture = PROCESS_FIXTURES.intersection(arg.arg for arg in function.args.args)
            if not (module_marks or slow_marks(function.decorator_list) or through_fixture):
                unmarked.append(f"{name}::{test} ({call})")
    assert unmarked == [], "mark these (pytest.mark.stack, pyproject.toml) or their module (pytestmark)"


def test_the_check_finds_a_test_that_starts_an_engine_through_a_fixture_or_a_helper():
    source = """
import pytest
from tests.runtime.support import sim_engine

@pytest.fixture
def engine():
    with sim_engine("--profile", "tiny-test") as e:
        yield e

def helper():
    return subprocess.Popen(["python"])

def manage(*args):
    return subprocess.run([sys.executable, "manage.py", *args], check=True)

def test_a_command(tmp_path):
    manage("check")

def test_a_tool():
    subprocess.run(["git", "ls-files"], check=True)

def test_through_the_fixture(engine):
    pass

def test_through_a_helper():
    helper()

@pytest.mark.stack
def test_marked(engine):
    pass

def test_in_process():
    pass
"""
    tree = ast.parse(source)
    found = starts_processes(tree)
    assert found == {
        "test_through_the_fixture": "engine -> sim_engine",
        "test_through_a_helper": "helper -> Popen",
        "test_a_command": "manage -> run",
        "test_marked": "engine -> sim_engine",
    }
    marked = next(n for n in tree.body if getattr(n, "name", "") == "test_marked")
    assert slow_marks(marked.decorator_list) == {"stack"}
    pytestmark = ast.parse("pytestmark = [pytest.mark.vllm, pytest.mark.skipif(True, reason='')]").body[0]
    assert is_pytestmark(pytestmark) and slow_marks([pytestmark.value]) == {"vllm"}
