"""Benchmarks run by the control plane: scheduling, claims, history, publishing and failures."""

import json
import subprocess
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction
from django.utils import timezone

from capacity.benchmark.config import SweepConfig
from capacity.benchmark.drivers import SimulatedDriver
from capacity.benchmark.results import BenchmarkError
from controlplane import profile_benchmarks
from controlplane.capacity.models import ModelProfile, ProfileFit
from controlplane.oncall.models import Event
from engine_model.profiles import get_profile
from tests.runtime.support import http, pid_alive, sim_engine

SHAPES = ((16, 1), (16, 16), (64, 64), (128, 128), (256, 16), (16, 200), (200, 64))
QUICK = SweepConfig(shapes=SHAPES, requests_per_step=40)
# Where the engine path itself is not the subject, the simulated performance model runs
# in-process on a virtual clock: the same numbers, deterministic, in a fraction of a second.
TINY = SimulatedDriver(get_profile("tiny-test"))


@pytest.fixture
def tiny_sim():
    # 10x the modelled speed, not 20x: at 20x a busy 2-core machine's client could not offer
    # three of SHAPES' rates (client-bound, left out), too few left to fit.
    with sim_engine("--profile", "tiny-test", "--time-scale", "10", "--enable-fault-injection") as sim:
        yield sim


@pytest.fixture
def local_pods(monkeypatch, settings):
    """Benchmarks on a local simulated pod; the pod processes their supervisor starts, as
    (pid, pod name), filled in as they start: a test checks those and no other process on the
    machine (other tests' and other runs' pods are not this benchmark's to stop)."""
    from dataplane.runtime import supervisor
    from dataplane.runtime.pod_process import PodLaunch

    settings.BENCHMARK_ENGINE_URL = ""
    settings.BENCHMARK_SIMULATED_PROFILE = "tiny-test"
    settings.BENCHMARK_SIMULATED_CLOCK = "wall"  # the pod over HTTP, not the in-process model
    settings.BENCHMARK_SIMULATED_TIME_SCALE = 20.0
    started: set[tuple[int, str]] = set()

    class RecordingSupervisor(supervisor.Supervisor):
        # Every process the supervisor reports: the one start_pod spawned, and any restart that
        # replaced it while the benchmark waited for the pod to be ready.
        def list_pods(self) -> list[supervisor.PodStatus]:
            pods = super().list_pods()
            started.update((p.pid, p.name) for p in pods if p.pid is not None)
            return pods

        def start_pod(self, launch: PodLaunch) -> None:
            super().start_pod(launch)
            self.list_pods()

    monkeypatch.setattr(supervisor, "Supervisor", RecordingSupervisor)
    return started


def still_running(pods: set[tuple[int, str]]) -> list[tuple[int, str]]:
    """The pods still running: the pid is alive and its command line names the pod (a pid that
    another process took since does not count)."""
    running = []
    for pid, name in pods:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if pid_alive(pid) and name.encode() in args:
            running.append((pid, name))
    return running


def test_a_good_fit_is_published_with_its_history(small_model, settings):
    settings.BENCHMARK_ENGINE_VERSION = "sim-1"
    assert profile_benchmarks.claim(small_model.pk, timezone.now())
    record = profile_benchmarks.run_benchmark(small_model, config=QUICK, driver=TINY)
    assert record.status == "published", record.reason
    small_model.refresh_from_db()
    assert (small_model.alpha, small_model.beta, small_model.gamma) == (
        record.alpha,
        record.beta,
        record.gamma,
    )
    assert small_model.source == "benchmark" and small_model.heldout_mape <= 0.10
    assert small_model.engine.startswith("simulated:tiny-test") and small_model.engine_version == "sim-1"
    assert small_model.benchmark_claimed_at is None  # released
    assert len(record.shapes) == len(SHAPES) and record.samples == len(SHAPES)
    assert record.beta > record.alpha  # decode costs more than prefill, as on a GPU
    event = Event.objects.get(kind="benchmark")
    assert event.severity == "info" and "published" in event.message


def test_a_poor_fit_is_refused_and_the_old_price_stays(small_model, settings):
    settings.BENCHMARK_MAX_HELDOUT_MAPE = 0.0  # nothing real is that good
    record = profile_benchmarks.run_benchmark(small_model, config=QUICK, driver=TINY)
    assert record.status == "refused" and "exceeds the 0.0% threshold" in record.reason
    small_model.refresh_from_db()
    assert (small_model.alpha, small_model.source) == (0.0004, "manual")
    assert Event.objects.get(kind="benchmark").severity == "warning"


@pytest.mark.stack
def test_a_failing_engine_is_reported_naming_the_shape_and_retried_later(small_model, tiny_sim, settings):
    settings.BENCHMARK_RETRY_BASE_S = 60
    http("POST", f"{tiny_sim.url}/_sim/fault", {"mode": "errors", "fraction": 1.0})
    before = timezone.now()
    record = profile_benchmarks.run_benchmark(small_model, engine_url=tiny_sim.url, config=QUICK)
    assert record.status == "failed" and "shape (16 in, 1 out): engine answered 500" in record.reason
    small_model.refresh_from_db()
    assert small_model.alpha == 0.0004 and small_model.benchmark_failures == 1
    assert small_model.benchmark_retry_at >= before + timedelta(seconds=60)
    event = Event.objects.get(kind="benchmark")
    # The engine answers (errors): a warning, not a page.
    assert event.severity == "warning" and "shape (16 in, 1 out)" in event.message
    assert not profile_benchmarks.due_profiles(timezone.now()).filter(pk=small_model.pk).exists()
    profile_benchmarks.run_benchmark(small_model, engine_url=tiny_sim.url, config=QUICK)
    small_model.refresh_from_db()
    assert small_model.benchmark_failures == 2  # backs off: 120 s now
    assert small_model.benchmark_retry_at >= timezone.now() + timedelta(seconds=110)
    # One event for the streak, brought up to date with its count.
    event = Event.objects.get(kind="benchmark")
    assert event.detail["count"] == 2 and "2 attempts in a row, next in 2 min" in event.message


def test_a_streak_backs_off_to_its_cap_and_pages_once_when_the_engine_is_unreachable(small_model, settings):
    settings.BENCHMARK_RETRY_BASE_S, settings.BENCHMARK_RETRY_MAX_S = 60, 4 * 3600
    assert [profile_benchmarks.retry_in_s(n) for n in (1, 2, 3, 8, 9, 60)] == [
        60, 120, 240, 7680, 14400, 14400
    ]  # fmt: skip
    gone = "http://127.0.0.1:9"  # discard port: nothing listens
    for _ in range(3):
        record = profile_benchmarks.run_benchmark(small_model, engine_url=gone, config=QUICK)
        assert record.status == "failed" and "unreachable" in record.reason
    events = list(Event.objects.filter(kind="benchmark"))
    assert [e.severity for e in events] == ["critical"] and events[0].detail["count"] == 3
    # A refused fit extends the streak (a warning would be a second event only for a new streak).
    settings.BENCHMARK_MAX_HELDOUT_MAPE = 0.0
    profile_benchmarks.run_benchmark(small_model, config=QUICK, driver=TINY)
    small_model.refresh_from_db()
    assert small_model.benchmark_failures == 4 and Event.objects.filter(kind="benchmark").count() == 1
    # A published fit ends it; the next failure starts a new streak with its own event.
    settings.BENCHMARK_MAX_HELDOUT_MAPE, settings.BENCHMARK_MAX_UNDERPRICE = 1.0, 1.0
    assert profile_benchmarks.run_benchmark(small_model, config=QUICK, driver=TINY).status == "published"
    small_model.refresh_from_db()
    assert (small_model.benchmark_failures, small_model.benchmark_retry_at) == (0, None)
    profile_benchmarks.run_benchmark(small_model, engine_url=gone, config=QUICK)
    assert Event.objects.filter(kind="benchmark", severity="critical").count() == 2


def test_each_pair_is_measured_on_its_own_simulated_profile_on_a_virtual_clock(small_model, settings):
    settings.BENCHMARK_ENGINE_URL, settings.BENCHMARK_SIMULATED_PROFILE = "", "auto"
    settings.BENCHMARK_SIMULATED_CLOCK = "virtual"
    small_model.simulated_profile = "tiny-test"
    small_model.save()
    first = profile_benchmarks.run_benchmark(small_model, config=QUICK)
    assert first.engine.startswith("simulated:tiny-test (in-process performance model, virtual clock)")
    # The virtual clock: the same numbers however busy the machine is.
    again = profile_benchmarks.run_benchmark(small_model, config=QUICK)
    assert [r["requests_per_minute"] for r in again.shapes] == [
        r["requests_per_minute"] for r in first.shapes
    ]
    small_model.simulated_profile = ""  # none of its own: its GPU type's
    assert small_model.engine_profile() == "h100-llama-8b"


def test_which_profiles_are_due(small_model, big_model, settings):
    now = timezone.now()
    assert set(profile_benchmarks.due_profiles(now)) == {small_model, big_model}  # never benchmarked
    ModelProfile.objects.update(source="benchmark", fitted_at=now, engine_version="v1")
    settings.BENCHMARK_ENGINE_VERSION = "v1"
    assert not profile_benchmarks.due_profiles(now).exists()
    ModelProfile.objects.filter(pk=small_model.pk).update(fitted_at=now - timedelta(days=8))  # stale
    ModelProfile.objects.filter(pk=big_model.pk).update(benchmark_requested_at=now)  # asked for
    assert set(profile_benchmarks.due_profiles(now)) == {small_model, big_model}
    settings.BENCHMARK_ENGINE_VERSION = "v2"  # a new engine makes every fit stale
    ModelProfile.objects.update(fitted_at=now, benchmark_requested_at=None)
    assert profile_benchmarks.due_profiles(now).count() == 2


def test_one_benchmark_per_pair_at_a_time(small_model, settings):
    now = timezone.now()
    assert profile_benchmarks.claim(small_model.pk, now)
    assert not profile_benchmarks.claim(small_model.pk, now)
    assert not profile_benchmarks.claim(small_model.pk, now, only_if_due=False)
    assert not profile_benchmarks.due_profiles(now).filter(pk=small_model.pk).exists()
    # A worker that died holding the claim does not block the pair for ever.
    later = now + timedelta(seconds=settings.BENCHMARK_CLAIM_TTL_S + 1)
    assert profile_benchmarks.claim(small_model.pk, later)


def test_a_task_queued_twice_does_not_benchmark_twice(small_model):
    # Beat queued the profile twice; the first run fitted it, so the second finds nothing due.
    from controlplane.tasks import run_profile_benchmark

    ModelProfile.objects.filter(pk=small_model.pk).update(source="benchmark", fitted_at=timezone.now())
    assert run_profile_benchmark(small_model.pk) == "not due, or claimed elsewhere"
    assert not ProfileFit.objects.exists()


@pytest.mark.stack
def test_a_local_simulated_pod_is_started_and_always_torn_down(small_model, settings, local_pods):
    settings.BENCHMARK_MAX_HELDOUT_MAPE = 1.0  # the pod's lifecycle is under test, not accuracy
    settings.BENCHMARK_MAX_UNDERPRICE = 1.0
    record = profile_benchmarks.run_benchmark(small_model, config=QUICK)
    assert record.status == "published", record.reason
    assert record.engine == "simulated:tiny-test (local pod, time scale 20, wall clock)"
    assert local_pods, "the benchmark started no pod"
    assert still_running(local_pods) == [], "the benchmark pod must not outlive its benchmark"


@pytest.mark.stack
def test_a_local_simulated_pod_is_torn_down_when_the_sweep_fails(small_model, local_pods, monkeypatch):
    async def failing_sweep(url, config, slo, api_key=""):
        raise BenchmarkError((16, 1), "engine answered 500: injected")

    monkeypatch.setattr(profile_benchmarks, "sweep", failing_sweep)
    record = profile_benchmarks.run_benchmark(small_model, config=QUICK)
    assert record.status == "failed" and "engine answered 500: injected" in record.reason
    assert local_pods, "the benchmark started no pod"
    assert still_running(local_pods) == [], "the benchmark pod must not outlive its benchmark"


@pytest.mark.stack
def test_a_keyed_engine_is_measured_with_the_fleet_key(small_model, settings, tmp_path):
    # The pod answers only the fleet key (vLLM's --api-key; the sim's alike): without
    # POD_KEY_FILE the benchmark fails on its 401, with it the sweep measures.
    two = SweepConfig(shapes=((16, 1), (16, 16)), requests_per_step=20)  # measured, too few to fit
    with sim_engine("--profile", "tiny-test", "--time-scale", "20", "--api-key", "fleet-k") as sim:
        refused = profile_benchmarks.run_benchmark(small_model, engine_url=sim.url, config=two)
        assert refused.status == "failed" and "answered 401" in refused.reason
        key = tmp_path / "fleet.key"
        key.write_text("fleet-k\n")
        key.chmod(0o600)
        settings.POD_KEY_FILE = str(key)
        measured = profile_benchmarks.run_benchmark(small_model, engine_url=sim.url, config=two)
    assert "need at least 5 distinct shapes to fit" in measured.reason, measured.reason


def test_no_engine_configured_is_a_clear_failure(small_model, settings):
    settings.BENCHMARK_ENGINE_URL = ""
    settings.BENCHMARK_SIMULATED_PROFILE = ""
    record = profile_benchmarks.run_benchmark(small_model, config=QUICK)
    assert record.status == "failed" and "no engine: set BENCHMARK_ENGINE_URL" in record.reason


@pytest.mark.stack
def test_the_command_prints_the_table_and_a_json_last_line(h100, tiny_sim, settings):
    settings.BENCHMARK_SHAPES = ",".join(f"{i}x{o}" for i, o in SHAPES)
    # HTTP timings on a shared 2-core machine are noisy; accuracy is bench/'s business, the
    # command's contract is this test's.
    settings.BENCHMARK_MAX_HELDOUT_MAPE = 1.0
    settings.BENCHMARK_MAX_UNDERPRICE = 1.0
    out = StringIO()
    call_command(
        "benchmark",
        "--model",
        "sim-tiny",
        "--gpu",
        "h100-80gb",
        "--engine-url",
        tiny_sim.url,
        "--create-model",
        "--json",
        stdout=out,
        stderr=StringIO(),
    )
    lines = out.getvalue().strip().splitlines()
    summary = json.loads(lines[-1])
    contract = {"alpha", "beta", "gamma", "delta", "r2", "heldout_mape", "samples", "published"}
    assert contract <= set(summary)
    assert summary["delta"] == 0.0 and summary["simulated"] is False  # the tiny profile has no vision
    # Every shape is priced from, or named as one this machine's client could not drive.
    assert summary["published"] is True and summary["samples"] + len(summary["client_bound"]) == len(SHAPES)
    assert lines[0].split()[:3] == ["in", "out", "solo"]
    profile = ModelProfile.objects.get(model="sim-tiny", gpu_type=h100)  # a new pair gets its profile
    assert profile.fits.get().status == ProfileFit.Status.PUBLISHED


def test_the_command_refuses_an_unknown_gpu(db):
    with pytest.raises(CommandError, match="unknown GPU type 'tpu'"):
        call_command("benchmark", "--model", "m", "--gpu", "tpu", stdout=StringIO(), stderr=StringIO())


def test_the_command_refuses_an_unknown_model_unless_told_to_create_it(small_model, big_model):
    """A typo would otherwise become a published, sellable profile."""
    with pytest.raises(CommandError) as refused:
        call_command(
            "benchmark",
            "--model",
            "llama-8bb",
            "--gpu",
            "h100-80gb",
            "--simulated",
            "tiny-test",
            stdout=StringIO(),
            stderr=StringIO(),
        )
    assert str(refused.value) == (
        "unknown model 'llama-8bb' on h100-80gb (its models: llama-70b, llama-8b); --create-model makes a"
        " profile for it, published and sellable when its fit passes"
    )
    assert not ModelProfile.objects.filter(model="llama-8bb").exists() and not ProfileFit.objects.exists()


@pytest.mark.stack
def test_the_command_from_a_shell_refuses_an_unknown_model_in_one_line(h100, transactional_db):
    """As an operator runs it: exit 1, one line naming the model, no traceback, nothing written."""
    import os
    import subprocess
    import sys

    from django.conf import settings

    db = settings.DATABASES["default"]
    if "postgresql" not in db["ENGINE"]:
        pytest.skip("the command's process reaches the test database through DATABASE_URL (PostgreSQL)")
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "benchmark",
            "--model",
            "typo-model",
            "--gpu",
            "h100-80gb",
            "--simulated",
            "tiny-test",
        ],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DATABASE_URL": url},
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        "CommandError: unknown model 'typo-model' on h100-80gb (its models: none); --create-model makes a"
        " profile for it, published and sellable when its fit passes"
    ]
    assert not ModelProfile.objects.exists()


def test_the_api_shows_history_and_takes_a_rerun_request(operator_client, owner_client, small_model):
    profile_benchmarks.run_benchmark(small_model, config=QUICK, driver=TINY)
    fits = operator_client.get(f"/api/v1/model-profiles/{small_model.pk}/fits/").json()
    assert [f["status"] for f in fits] == ["published"]
    assert {"alpha", "beta", "gamma", "r2", "heldout_mape", "intervals", "shapes"} <= set(fits[0])
    profile = operator_client.get(f"/api/v1/model-profiles/{small_model.pk}/").json()
    assert profile["source"] == "benchmark" and profile["heldout_mape"] == fits[0]["heldout_mape"]
    assert owner_client.post(f"/api/v1/model-profiles/{small_model.pk}/benchmark/").status_code == 403
    asked = operator_client.post(f"/api/v1/model-profiles/{small_model.pk}/benchmark/")
    assert asked.status_code == 202 and asked.json()["benchmark_requested_at"]
    assert profile_benchmarks.due_profiles(timezone.now()).filter(pk=small_model.pk).exists()


@pytest.mark.stack
@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_beat_and_a_real_worker_benchmark_due_profiles_on_their_own(small_model, tmp_path):
    """Real Celery beat + worker processes on the real Redis: the beat tick finds the profile
    due, the worker starts a local simulated pod, sweeps, fits, and the fit lands in PostgreSQL."""
    import os
    import sys
    import time

    import redis
    from django.conf import settings as django_settings

    broker = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
    redis.Redis.from_url(broker).flushdb()  # no stale tasks from an earlier run
    db = django_settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": broker,
        "BENCHMARK_ENGINE_URL": "",
        "BENCHMARK_SIMULATED_PROFILE": "tiny-test",
        "BENCHMARK_SIMULATED_TIME_SCALE": "20",
        "BENCHMARK_SHAPES": ",".join(f"{i}x{o}" for i, o in SHAPES),
        "BENCHMARK_CHECK_INTERVAL_S": "1",
        "BENCHMARK_MAX_HELDOUT_MAPE": "1.0",  # the wiring is under test here, not accuracy
        "BENCHMARK_MAX_UNDERPRICE": "1.0",
        "CAPACITY_SNAPSHOT_INTERVAL_S": "3600",
    }
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "controlplane",
            "worker",
            "--beat",
            "--pool=solo",
            "--loglevel=INFO",
            f"--schedule={tmp_path / 'beat'}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not ProfileFit.objects.filter(profile=small_model).exists() and time.monotonic() < deadline:
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(0.5)  # waiting on other processes, not faking time
        fit = ProfileFit.objects.filter(profile=small_model).first()
        assert fit is not None, (tmp_path / "worker.log").read_text()[-3000:]
        assert fit.status == "published" and fit.engine.startswith("simulated:tiny-test")
        small_model.refresh_from_db()
        assert small_model.source == "benchmark" and small_model.benchmark_claimed_at is None
        assert Event.objects.filter(kind="benchmark", message__contains="published").exists()
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(timeout=30)
        log.close()


@pytest.mark.stack
@pytest.mark.django_db(transaction=True)
def test_with_a_cluster_the_benchmark_measures_a_pod_declared_for_its_claim(settings, small_model, tmp_path):
    """The real local agent: while the benchmark holds its claim, the autoscaler's pass declares
    bench-{profile}; the benchmark measures that pod; the released claim makes the pass remove it."""
    import os
    import sys
    import threading

    from django.db import connection

    from controlplane import drivers, scaling
    from tests.runtime.support import agent_token_file, answers, free_port, wait_until

    port = free_port()
    settings.CLUSTER_DRIVER, settings.CLUSTER_AGENT_URL = "local", f"http://127.0.0.1:{port}"
    settings.CLUSTER_AGENT_TOKEN_FILE = token_file = agent_token_file(tmp_path)
    settings.BENCHMARK_ENGINE_URL, settings.BENCHMARK_POD_ENGINE = "", "sim"
    settings.BENCHMARK_SIMULATED_PROFILE, settings.BENCHMARK_SIMULATED_TIME_SCALE = "tiny-test", 20.0
    settings.BENCHMARK_SIMULATED_CLOCK = "wall"  # a pod of its own, declared for its claim
    settings.BENCHMARK_SHAPES = ",".join(f"{i}x{o}" for i, o in SHAPES)
    settings.BENCHMARK_MAX_HELDOUT_MAPE = 1.0  # the wiring is under test here, not accuracy
    settings.BENCHMARK_MAX_UNDERPRICE = 1.0
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dataplane.cluster.agent",
            "--listen",
            f"127.0.0.1:{port}",
            "--token-file",
            token_file,
            "--drain-delay",
            "0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    cluster = drivers.driver()
    stop = threading.Event()

    def beat():  # the horizontal pass, as beat runs it (its lease lets one through every 2.5 s)
        try:
            while not stop.wait(0.5):
                scaling.horizontal_pass(cluster, timezone.now())
        finally:
            connection.close()

    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/healthz"), timeout=30)
        passes = threading.Thread(target=beat)
        passes.start()
        try:
            assert profile_benchmarks.claim(small_model.pk, timezone.now())
            fit = profile_benchmarks.run_benchmark(small_model)
            assert fit.status == "published", fit.reason
            assert fit.engine.startswith(f"simulated:tiny-test (cluster pod bench-{small_model.pk}-")
            # The claim is released: the next pass undeclares the deployment, the agent stops it.
            wait_until(lambda: not cluster.list_pods(), timeout=30)
        finally:
            stop.set()
            passes.join(timeout=10)
    finally:
        os.killpg(agent.pid, 15)
        agent.wait(timeout=30)


def test_the_sweep_takes_its_shapes_and_wall_budget_from_settings(settings):
    settings.BENCHMARK_SHAPES = "16x1,128x16"
    settings.BENCHMARK_MAX_WALL_S = 600.0
    config = profile_benchmarks.sweep_config()
    assert config.shapes == ((16, 1), (128, 16)) and config.max_wall_s == 600.0
    settings.BENCHMARK_MAX_WALL_S = 0.0
    assert profile_benchmarks.sweep_config().max_wall_s is None  # no cap but the share of the first pass
    settings.BENCHMARK_SHAPES = "16x1,big"
    with pytest.raises(ValueError, match="BENCHMARK_SHAPES='16x1,big': write shapes as 16x1"):
        profile_benchmarks.sweep_config()


# The command on a model the GPU type has no profile of, measured on the simulated tiny profile.
NEW_SIMULATED_MODEL = (
    "benchmark",
    "--model",
    "sim-tiny",
    "--gpu",
    "h100-80gb",
    "--simulated",
    "tiny-test",
    "--create-model",
)


def test_the_command_measures_a_simulated_profile_on_the_virtual_clock(h100, settings):
    settings.BENCHMARK_SHAPES = ",".join(f"{i}x{o}" for i, o in SHAPES)
    out = StringIO()
    call_command(*NEW_SIMULATED_MODEL, "--json", stdout=out)
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    contract = ("alpha", "beta", "gamma", "delta", "r2", "heldout_mape", "samples", "published")
    assert set(contract) <= set(summary) and summary["delta"] == 0.0 and summary["samples"] == len(SHAPES)
    assert summary["simulated"] and summary["engine"].startswith("simulated:tiny-test")
    with pytest.raises(CommandError, match="unknown profile 'no-such'"):
        call_command("benchmark", "--model", "m", "--gpu", "h100-80gb", "--simulated", "no-such")


def test_a_new_model_whose_benchmark_fails_is_a_clear_error_and_makes_no_profile(h100, settings):
    """--create-model makes the profile only from a fit: a failed run names why, stores nothing."""
    settings.BENCHMARK_SHAPES = "16x1,16x16"  # measured, too few to fit
    with pytest.raises(CommandError, match="need at least 5 distinct shapes to fit"):
        call_command(*NEW_SIMULATED_MODEL, stdout=StringIO(), stderr=StringIO())
    out = StringIO()
    call_command(*NEW_SIMULATED_MODEL, "--json", stdout=out, stderr=StringIO())
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    assert (summary["status"], summary["published"]) == ("failed", False), summary
    assert not ModelProfile.objects.filter(model="sim-tiny").exists()
    assert not ProfileFit.objects.exists() and not Event.objects.exists()


def test_a_profile_s_gamma_may_be_below_zero_down_to_minus_beta(operator_client, small_model):
    # A fit on the decoded tokens publishes gamma = gamma_d - beta; an operator may write the
    # same, and nothing that would price a one-token answer below nothing.
    url = f"/api/v1/model-profiles/{small_model.pk}/"
    beta = small_model.beta
    assert operator_client.patch(url, {"gamma": -beta / 2}, format="json").status_code == 200
    refused = operator_client.patch(url, {"gamma": -2 * beta}, format="json")
    assert refused.status_code == 400
    assert refused.json()["fields"]["gamma"]["errors"] == [
        f"must be >= -beta ({-beta:g}): a one-token answer costs >= 0, got {-2 * beta:g}"
    ]
    small_model.refresh_from_db()
    assert small_model.gamma == -beta / 2
    with pytest.raises(IntegrityError):  # the database holds the rule too
        with transaction.atomic():
            ModelProfile.objects.filter(pk=small_model.pk).update(gamma=-2 * beta)
