"""Every benchmark in bench/ in its smoke mode (`--smoke`: tiny sizes, seconds), run as a user runs
it, a subprocess from the repository's root: a bench that no longer starts fails here, named, not
weeks later when someone needs its figures (api_latency.py and the console's bench once failed at
once on an IntegrityError after a model change, and nobody noticed). Each must exit 0 and print a
line of its figures (`Bench.printed`). A bench that needs what this machine lacks (wrk, nginx,
HAProxy, the Rust vllm-router, a commit a shallow clone has not) is skipped, the reason naming
it; a bench whose peer is missing (OR-Tools, vLLM, wrk for sim_http_ceiling.py) runs its own side.
The benches that take a PostgreSQL database get their own, named after the test run's
(DATABASE_URL's name + `_smoke_` + the bench), dropped afterwards, each a copy of one migrated
once for them all (BENCH_TEMPLATE_DATABASE): migrating anew is most of a fleet bench's smoke run.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

# In bench/ but not benches: what the benches import, start or source. Each runs through a bench
# or a test of its own; a new file in bench/ is either named here or has a smoke test below.
HELPERS = {
    "fleet.py": "the fleet benches' loader and shared code (imported; tests/test_bench_fleet.py)",
    "slow_backend.py": "concurrency.sh's stand-in pod (started by it)",
    "locustfile.py": "locust's users, run by locust, not python (tests/test_loadgen.py runs it headless)",
    "nginx_pods.sh": "nginx as pods, sourced by the router benches",
}
WRK_NGINX = ("wrk", "nginx")
ROUTER_PEERS_CACHE = Path(os.environ.get("ROUTER_PEERS_CACHE", Path.home() / ".cache/router-peers"))
VLLM_ROUTER = ROUTER_PEERS_CACHE / "venv/bin/vllm-router"  # router_peers.sh would pip-install it
AZURE_TRACE = Path("/work/shared/data/azure-llm-2023-conv.csv")
BEFORE_EXACT_METERING = "f602ef5"  # router_metering.sh's and router_instructions.sh's BASE_REF


@dataclass(frozen=True)
class Bench:
    printed: str  # a regular expression a line of its figures matches
    timeout_s: float = 30.0
    database: str | None = None  # the environment variable of its PostgreSQL database's URL
    programs: tuple[str, ...] = ()  # on PATH, else skipped
    files: tuple[Path, ...] = ()  # there, else skipped
    commit: str | None = None  # in this clone, else skipped


BENCHES = {
    "api_latency.py": Bench(r"^200 operator: sale, 20 concurrent sellers +\d+ ", 90, "BENCH_DATABASE_URL"),
    "autoscaler_cost.py": Bench(r"^ +50 +\d+\.\d+ +\d+\.\d+"),
    "autoscaler_policies.py": Bench(r"^smoke: goal "),
    "autoscaler_frontier.py": Bench(r"^goal holds on \d of 1 families$", 90),
    "balancing.py": Bench(r"^p2c-mu \+ sticky k=\d +\d+\.\d+", files=(AZURE_TRACE,)),
    "balancing_http.py": Bench(r"^p2c-mu tc=4 +\d+ +\d+ +\d+\.\d+", 60),
    "console_latency.py": Bench(r"^200 on-call, a tenant's +\d+ ", 90, "BENCH_DATABASE_URL"),
    "embedded_broker.py": Bench(r"^consumed/sent +\d+/30 ", 60, programs=("redis-server",)),
    "embedded_soak.py": Bench(r"process deaths: \d+ ", 120, programs=("redis-server",)),
    "history_reads.py": Bench(r"^endpoint charts 1w +median ", 90, "BENCH_DATABASE_URL"),
    "ledger_scale.py": Bench(r"^ledger of every pool \(pool_ledgers\) +3 ", 60, "LEDGER_BENCH_DATABASE_URL"),
    "metering_scale.py": Bench(r"^slots 2 10 [\d. ]+ (True|False) ", programs=("redis-server",)),
    "model_units.py": Bench(r"^alpha .* held-out MAPE .* shapes; sweep \d+\.\d s wall", 60),
    "oncall_webhook.py": Bench(r"^max \d+\.\d+ s, contract 15 s", 60, programs=("redis-server",)),
    "packing.py": Bench(r"^minimum packing efficiency over all pools: "),
    "router_image_sizing.py": Bench(r"^png-8mb sizing: base / this = ", 60, programs=("git", "tar")),
    "web_concurrency.py": Bench(r"^mixed +the 20 pools +4 +\d+ ", 90, "BENCH_DATABASE_URL"),
    "routing_table_fanout.py": Bench(
        r"^20 published 304 3 ", 90, "BENCH_DATABASE_URL", programs=("redis-server", "pgrep")
    ),
    "runtime_fleet.py": Bench(r"^RSS: +\d+\.\d MiB per pod"),
    "sale_latency.py": Bench(r"^200 sale, (sold|refused \(409\)) +\d+ ", 60, "BENCH_DATABASE_URL"),
    "sim_http_ceiling.py": Bench(r"^16x16 \| [\d,]+ /min \| "),
    "simulated_profile_fits.py": Bench(r"^tiny-test +seed 0 +held-out "),
    "simulator_cost.py": Bench(r"^~2 replicas, 1 min +python +\d+ +\d+"),
    "vllm_timing.py": Bench(r"^ITL batch 8 / batch 1 +"),  # .venv has no vllm: the simulator's side
    "warm_start.py": Bench(r"^cold/warm: median \d+\.\d+x"),
    "concurrency.sh": Bench(r"^router peak in-flight", 60, programs=("wrk", "curl")),
    "router_capacity.sh": Bench(r"^saturation: req_per_s \d+", 60, programs=(*WRK_NGINX, "curl")),
    "router_instructions.sh": Bench(
        r"^json +\d+ +\d+ +\d+\.\d+", 240, programs=("valgrind", "nginx", "git"), commit=BEFORE_EXACT_METERING
    ),
    "router_limiter.sh": Bench(
        r"^ratio leased/inproc req_per_s \d",
        60,
        programs=(*WRK_NGINX, "redis-server", "redis-cli", "curl", "taskset"),
        files=(VLLM_ROUTER,),
    ),
    "router_metering.sh": Bench(
        r"^ratio json ours/base req_per_s \d",
        90,
        programs=(*WRK_NGINX, "curl", "git"),
        commit=BEFORE_EXACT_METERING,
    ),
    "router_peers.sh": Bench(
        r" median_p99_ms \d",
        90,
        programs=(*WRK_NGINX, "haproxy", "taskset"),
        files=(VLLM_ROUTER, Path("/work/shared/bench/router-peers.sh")),
    ),
}


def runnable() -> set[str]:
    return {p.name for p in BENCH.glob("*.py")} | {p.name for p in BENCH.glob("*.sh")}


def test_every_bench_in_bench_has_a_smoke_test():
    assert set(HELPERS) <= runnable(), "a helper named here is gone from bench/"
    assert sorted(runnable() - set(HELPERS)) == sorted(BENCHES), (
        "every bench in bench/ takes --smoke and is run below (BENCHES), or is a helper (HELPERS)"
    )
    # a shell script ignores an argument it does not know: each must say what --smoke does
    assert [name for name in BENCHES if "--smoke" not in (BENCH / name).read_text()] == []


def missing(bench: Bench) -> list[str]:
    lacking = [p for p in bench.programs if shutil.which(p) is None]
    lacking += [str(f) for f in bench.files if not f.exists()]
    if bench.commit and (
        shutil.which("git") is None
        or subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{bench.commit}^{{commit}}"], capture_output=True
        ).returncode
    ):
        lacking.append(f"commit {bench.commit} in this clone")
    return lacking


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def admin_url(url: str) -> str:
    return urlparse(url)._replace(path="/postgres").geturl()


def drop(url: str) -> None:
    with psycopg.connect(admin_url(url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{urlparse(url).path.lstrip("/")}" WITH (FORCE)')


def named(suffix: str) -> str:
    """A database URL on the test run's server, named after its database."""
    test_url = os.environ.get("DATABASE_URL", "")
    if not test_url.startswith(("postgres://", "postgresql://")):
        pytest.skip(f"needs PostgreSQL: DATABASE_URL=postgres://... (the test run's is {test_url!r})")
    own = f"{urlparse(test_url).path.lstrip('/')}_smoke_{suffix}"
    return urlparse(test_url)._replace(path=f"/{own}").geturl()


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory):
    """A database migrated once, which each bench's copies (BENCH_TEMPLATE_DATABASE); its name."""
    url = named("template")
    drop(url)
    with psycopg.connect(admin_url(url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{urlparse(url).path.lstrip("/")}"')
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "SECRET_KEY": "bench-only-not-a-secret",
        "CONTROLPLANE_VAR_DIR": str(tmp_path_factory.mktemp("template")),
    }
    migrate = [sys.executable, "manage.py", "migrate", "--noinput", "-v0"]
    done = subprocess.run(migrate, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"migrating the benches' template database:\n{done.stdout}{done.stderr}"
    yield urlparse(url).path.lstrip("/")
    drop(url)


@pytest.fixture
def database(request: pytest.FixtureRequest, template: str):
    """The bench's own database URL, named after the test run's; dropped afterwards."""
    url = named(Path(request.node.callspec.params["name"]).stem)
    drop(url)  # a run killed before its teardown
    yield url
    drop(url)


def bench_env(bench: Bench, tmp: Path, database: str | None, template: str | None) -> dict[str, str]:
    """The environment a user's shell would give it: none of the test run's database, Redis or
    settings (each bench picks its own), free ports, this interpreter for the shell scripts."""
    left_out = {
        "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE", "SECRET_KEY",
        "BENCH_DATABASE_URL", "LEDGER_BENCH_DATABASE_URL", "BENCH_TEMPLATE_DATABASE", "SIZES", "SECONDS",
        "POLLS_200", "POLLS_304",
    }  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in left_out}
    env.update(
        PYTHONPATH=str(ROOT),
        PY=sys.executable,
        BENCH_PORT=str(free_port()),
        CONTROLPLANE_VAR_DIR=str(tmp / "var"),
    )
    if bench.database:
        assert database is not None and template is not None
        env[bench.database] = database
        env["BENCH_TEMPLATE_DATABASE"] = template
    return env


@pytest.mark.stack  # each bench starts processes: servers, engines, routers, the embedded stack
@pytest.mark.parametrize("name", sorted(BENCHES))
def test_bench_runs_in_its_smoke_mode(name: str, request: pytest.FixtureRequest, tmp_path: Path):
    bench = BENCHES[name]
    if lacking := missing(bench):
        pytest.skip(f"bench/{name} needs {', '.join(lacking)}")
    database = request.getfixturevalue("database") if bench.database else None
    template = request.getfixturevalue("template") if bench.database else None
    command = ["bash" if name.endswith(".sh") else sys.executable, f"bench/{name}", "--smoke"]
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=bench_env(bench, tmp_path, database, template),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its servers and engines with it, if it must be killed
    )
    try:
        output, _ = process.communicate(timeout=bench.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"bench/{name} --smoke ran past {bench.timeout_s:g} s:\n{output[-4000:]}")
    took = time.monotonic() - started
    assert process.returncode == 0, (
        f"bench/{name} --smoke exited {process.returncode} after {took:.1f} s:\n{output[-4000:]}"
    )
    assert re.search(bench.printed, output, re.M), (
        f"bench/{name} --smoke printed no line matching {bench.printed!r}:\n{output[-4000:]}"
    )


@pytest.mark.stack  # a Python process of its own
def test_the_frontier_bench_refuses_png_without_matplotlib_before_it_simulates(tmp_path: Path):
    """--png without matplotlib is refused at the start, naming what to install, not at the
    first plot after a family's minutes of simulation (a module set to None cannot be imported)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = sys.argv[1:];"
            " runpy.run_path('bench/autoscaler_frontier.py', run_name='__main__')",
            "bench/autoscaler_frontier.py",
            "--png",
            str(tmp_path / "png"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--png needs matplotlib" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "png").exists()
