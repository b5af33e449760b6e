"""Benchmarks from the control plane: which profiles are due, one at a time, and their history.

`run_benchmark(profile)` measures a model x GPU pair (capacity.benchmark.sweep), fits its price
(capacity.fitting), keeps every attempt as a ProfileFit, publishes a good fit as the profile's
coefficients, and writes a benchmark Event either way. A profile is due when it was never
benchmarked, its fit is older than BENCHMARK_MAX_AGE_S, the engine version changed, or an
operator asked for a re-run. Claims are filtered updates (two workers never measure one pair).

Where no GPU can be had (BENCHMARK_SIMULATED_PROFILE), each pair is measured on its own simulated
profile (ModelProfile.engine_profile(): 70B on 4 x H100 is not 8B on an L40S), in-process on a
virtual clock by default (BENCHMARK_SIMULATED_CLOCK), so the machine's load cannot bend the
numbers; the record's engine says "simulated:<profile>". A pair measured on a cluster pod has a
deployment of its own (`benchmark_deployments`), which the autoscaler's pass declares
(controlplane.scaling) while the benchmark holds the profile's claim.

A failure or a refused fit starts or extends a streak: the next try waits 60 s, doubling per
attempt in a row up to BENCHMARK_RETRY_MAX_S (4 h), and the streak has one on-call event whose
message and count are brought up to date at each attempt (warning; critical, once per streak,
when the engine itself was unreachable). A published fit ends the streak. No engine pod is left
running, whatever happens.
"""

import asyncio
import logging
import secrets
import shlex
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from capacity import numbers
from capacity.benchmark.checks import client_bound_verdict
from capacity.benchmark.config import DEFAULT_SHAPES, Slo, SweepConfig, on_virtual_clock
from capacity.benchmark.drivers import Driver, SimulatedDriver
from capacity.benchmark.extras import Extras, measure_extras
from capacity.benchmark.results import BenchmarkError, SweepResult
from capacity.benchmark.sweep import sweep
from capacity.fitting import Fit
from controlplane.capacity.models import ModelProfile, ProfileFit
from controlplane.endpoints.deployments import benchmark_deployment_name, vllm_args
from controlplane.oncall.models import Event
from dataplane.cluster.driver import Deployment
from dataplane.keys import read_fleet_keys
from dataplane.runtime import engine_auth
from engine_model.profiles import get_profile

log = logging.getLogger("controlplane.capacity.profile_benchmarks")  # its name before it moved up


def due_profiles(now: datetime) -> QuerySet[ModelProfile]:
    stale = now - timedelta(seconds=settings.BENCHMARK_MAX_AGE_S)
    claim_expired = now - timedelta(seconds=settings.BENCHMARK_CLAIM_TTL_S)
    due = Q(source=ModelProfile.Source.MANUAL, fitted_at__isnull=True) | Q(fitted_at__lt=stale)
    due |= Q(benchmark_requested_at__isnull=False)
    if settings.BENCHMARK_ENGINE_VERSION:
        due |= ~Q(engine_version=settings.BENCHMARK_ENGINE_VERSION)
    return (
        ModelProfile.objects.filter(due)
        .filter(Q(benchmark_claimed_at__isnull=True) | Q(benchmark_claimed_at__lt=claim_expired))
        .filter(Q(benchmark_retry_at__isnull=True) | Q(benchmark_retry_at__lte=now))
        .select_related("gpu_type")
        .order_by("id")
    )


def claim(profile_id: int, now: datetime, *, only_if_due: bool = True) -> bool:
    """Take the profile for one benchmark; False when another worker holds it, or (for the beat's
    tasks) when it is no longer due: beat may queue a profile twice before a worker gets to it."""
    claim_expired = now - timedelta(seconds=settings.BENCHMARK_CLAIM_TTL_S)
    profiles = (
        due_profiles(now)
        if only_if_due
        else ModelProfile.objects.filter(
            Q(benchmark_claimed_at__isnull=True) | Q(benchmark_claimed_at__lt=claim_expired)
        )
    )
    return profiles.filter(pk=profile_id).update(benchmark_claimed_at=now) == 1


def slo() -> Slo:
    return Slo(settings.BENCHMARK_SLO_FIRST_TOKEN_S, settings.BENCHMARK_SLO_PER_OUTPUT_TOKEN_S)


def sweep_config() -> SweepConfig:
    shapes = DEFAULT_SHAPES
    if settings.BENCHMARK_SHAPES:
        try:
            shapes = tuple(
                (int(i), int(o))
                for i, o in (pair.split("x") for pair in settings.BENCHMARK_SHAPES.split(","))
            )
        except ValueError:
            raise ValueError(
                f"BENCHMARK_SHAPES={settings.BENCHMARK_SHAPES!r}: write shapes as 16x1,128x16,..."
            ) from None
    time_scale = 1.0 if settings.BENCHMARK_ENGINE_URL else settings.BENCHMARK_SIMULATED_TIME_SCALE
    return SweepConfig(shapes=shapes, time_scale=time_scale, max_wall_s=settings.BENCHMARK_MAX_WALL_S or None)


def simulated_profile_name(profile: ModelProfile) -> str | None:
    """The simulated engine profile a benchmark of this pair measures; None: simulation is off."""
    setting = settings.BENCHMARK_SIMULATED_PROFILE
    if not setting:
        return None
    return profile.engine_profile() if setting == "auto" else setting


def runs_in_process(profile: ModelProfile, engine_url: str | None = None) -> bool:
    """Whether a benchmark of this pair runs the simulated profile in-process on the virtual
    clock: no engine URL, simulation on, BENCHMARK_SIMULATED_CLOCK "virtual", no vLLM pod."""
    if engine_url or settings.BENCHMARK_ENGINE_URL or settings.BENCHMARK_SIMULATED_CLOCK != "virtual":
        return False
    if settings.BENCHMARK_POD_ENGINE == "vllm":
        from controlplane import drivers

        if drivers.driver() is not None:
            return False
    return simulated_profile_name(profile) is not None


def in_process_driver(profile: ModelProfile, engine_url: str | None = None) -> SimulatedDriver | None:
    """The pair's simulated profile on the virtual clock, when that is what measures it (an
    unknown profile name raises ValueError naming the known ones)."""
    name = simulated_profile_name(profile)
    return SimulatedDriver(get_profile(name)) if name and runs_in_process(profile, engine_url) else None


def fleet_key() -> str:
    """The fleet credential that pods answer to (POD_KEY_FILE; "" without one: open pods)."""
    try:
        return (read_fleet_keys(settings.POD_KEY_FILE or None, "MU_POD_KEY") or [""])[0]
    except ValueError as exc:
        raise BenchmarkError(None, f"POD_KEY_FILE: {exc}") from None


@contextmanager
def benchmark_engine(
    profile: ModelProfile, engine_url: str | None = None
) -> Iterator[tuple[str, float, str, str]]:
    """(engine URL, time scale, what to call it, the key its pod asks for) for this pair; a local
    simulated pod is stopped whatever happens, and its fits say "simulated" so they are never
    mistaken for a GPU's."""
    url = engine_url or settings.BENCHMARK_ENGINE_URL
    if url:
        yield url, 1.0, url, fleet_key()
        return
    from controlplane import drivers

    cluster = drivers.driver()
    if cluster is not None:
        yield (*cluster_engine(cluster, profile), fleet_key())
        return  # the claim's release undeclares the pod: the next pass removes it
    simulated = simulated_profile_name(profile)
    if not simulated:
        raise BenchmarkError(None, "no engine: set BENCHMARK_ENGINE_URL (or BENCHMARK_SIMULATED_PROFILE)")
    from dataplane.runtime.pod_process import PodLaunch
    from dataplane.runtime.supervisor import Supervisor

    supervisor = Supervisor()
    port, probe_port = _free_port(), _free_port()
    name = f"benchmark-{profile.pk}-{port}"
    scale = settings.BENCHMARK_SIMULATED_TIME_SCALE
    key = secrets.token_urlsafe(32)  # this pod's own: it answers this benchmark alone
    supervisor.start_pod(
        PodLaunch(
            name,
            "sim",
            port,
            probe_port,
            args=("--profile", simulated, "--time-scale", str(scale)),
            env=((engine_auth.ENV_VARIABLE, key),),
        )
    )
    try:
        deadline = time.monotonic() + 30
        while not _ready(supervisor, name):
            if time.monotonic() > deadline:
                raise BenchmarkError(
                    None, f"benchmark pod {name} was not ready within 30 s", unreachable=True
                )
            time.sleep(0.1)  # waiting on a process starting, not faking time
        label = f"simulated:{simulated} (local pod, time scale {scale:g}, wall clock)"
        yield f"http://127.0.0.1:{port}", scale, label, key
    finally:
        supervisor.stop_pod(name, grace_s=5)
        supervisor.close()


def cluster_engine(cluster, profile: ModelProfile) -> tuple[str, float, str]:  # type: ignore[no-untyped-def]
    """The benchmark deployment's pod, once ready: the autoscaler's pass declares it for as long
    as this benchmark holds the profile's claim."""
    name = benchmark_deployment_name(profile.pk)
    deadline = time.monotonic() + settings.BENCHMARK_POD_READY_TIMEOUT_S
    while True:
        ready = [p for p in cluster.list_pods() if p.deployment == name and p.ready]
        if ready:
            break
        if time.monotonic() > deadline:
            raise BenchmarkError(
                None,
                f"benchmark pod of {name} not ready within {settings.BENCHMARK_POD_READY_TIMEOUT_S:g} s"
                " (the autoscaler's pass declares it: is Celery beat running?)",
                unreachable=True,
            )
        time.sleep(0.5)  # waiting on the cluster, not faking time
    vllm = settings.BENCHMARK_POD_ENGINE == "vllm"
    scale = 1.0 if vllm else settings.BENCHMARK_SIMULATED_TIME_SCALE
    simulated = simulated_profile_name(profile) or profile.engine_profile()
    engine = "vllm" if vllm else f"simulated:{simulated}"
    return ready[0].url, scale, f"{engine} (cluster pod {ready[0].name}, time scale {scale:g})"


def _benchmark_sim_profile(profile: ModelProfile) -> str:
    return simulated_profile_name(profile) or profile.engine_profile()


def benchmark_deployment(profile: ModelProfile) -> Deployment:
    """The engine a benchmark of `profile` measures (BENCHMARK_POD_ENGINE): one replica."""
    if settings.BENCHMARK_POD_ENGINE == "vllm":
        engine = "vllm"
        args: tuple[str, ...] = vllm_args(
            settings.BENCHMARK_VLLM_MODEL or profile.model,
            profile.gpus_per_replica,
            extra=tuple(shlex.split(settings.BENCHMARK_VLLM_ARGS)),
        )
    else:
        engine = "sim"
        args = (
            "--profile",
            _benchmark_sim_profile(profile),
            "--time-scale",
            str(settings.BENCHMARK_SIMULATED_TIME_SCALE),
        )
    name = benchmark_deployment_name(profile.pk)
    return Deployment(name, 1, engine, args, 1, {"benchmark": str(profile.pk)})


def benchmark_deployments(now: datetime) -> list[Deployment]:
    """A deployment for every benchmark under way that needs an engine of its own."""
    if settings.BENCHMARK_ENGINE_URL:
        return []
    live = now - timedelta(seconds=settings.BENCHMARK_CLAIM_TTL_S)
    claimed = ModelProfile.objects.filter(benchmark_claimed_at__gt=live).select_related("gpu_type")
    # A benchmark on the virtual clock runs in-process: it needs no pod.
    return [benchmark_deployment(p) for p in claimed.order_by("id") if not runs_in_process(p)]


def run_benchmark(
    profile: ModelProfile,
    *,
    engine_url: str | None = None,
    config: SweepConfig | None = None,
    driver: Driver | None = None,
) -> ProfileFit:
    """Measure, fit, record and maybe publish; always releases the claim."""
    started = timezone.now()
    config = config or sweep_config()
    fit: Fit | None = None
    result: SweepResult | None = None
    extras: Extras | None = None  # images and the prefix cache: measured on simulated profiles
    try:
        driver = driver or in_process_driver(profile, engine_url)
        if isinstance(driver, SimulatedDriver):
            # Virtual time throughout: how many second looks fit is counted in engine seconds
            # too, so a busy machine changes neither the measurements nor which were taken.
            # A step costs no wall time here: bisect the open loop to within 1 % of the
            # capacity, and the closed loop's knee to within a few requests in flight.
            config = on_virtual_clock(config)
            result = asyncio.run(sweep(driver, config, slo(), clock=lambda: driver.elapsed_s))
        elif driver is not None:  # another in-process engine
            result = asyncio.run(sweep(driver, config, slo()))
        else:
            with benchmark_engine(profile, engine_url) as (url, scale, label, key):
                config = SweepConfig(**{**asdict(config), "time_scale": scale})
                result = replace(asyncio.run(sweep(url, config, slo(), api_key=key)), engine_url=label)
        fit = result.fit(profile.mu_per_replica_minute, settings.BENCHMARK_MAX_UNDERPRICE)
        if isinstance(driver, SimulatedDriver):
            extras = asyncio.run(
                measure_extras(driver.profile, fit, config, slo(), profile.mu_per_replica_minute)
            )
    except (BenchmarkError, ValueError) as error:
        unreachable = isinstance(error, BenchmarkError) and error.unreachable
        return _record_failure(profile, started, str(error), result, unreachable)
    publish, reason = fit.verdict(settings.BENCHMARK_MAX_HELDOUT_MAPE, settings.BENCHMARK_MAX_UNDERPRICE)
    bound_ok, why = client_bound_verdict(
        result.shapes, fit.predict, profile.mu_per_replica_minute, settings.BENCHMARK_MAX_HELDOUT_MAPE
    )
    if publish and not bound_ok:
        publish, reason = False, why
    factor_ok = False
    if extras is not None:
        ok, factor_ok, why = extras.verdict(
            settings.BENCHMARK_MAX_HELDOUT_MAPE, settings.BENCHMARK_MAX_UNDERPRICE
        )
        publish, reason = publish and ok, f"{reason}; {why}" if ok or not publish else why
    record = ProfileFit(
        profile=profile,
        status=ProfileFit.Status.REFUSED,
        reason=reason,
        alpha=fit.alpha,
        beta=fit.beta,
        gamma=fit.gamma,
        rho=fit.rho,
        kappa=fit.kappa,
        delta=extras.images.value if extras and extras.images else None,
        cached_token_factor=extras.prefix.value if extras and factor_ok else None,
        r2=fit.r2,
        heldout_mape=fit.heldout_mape,
        samples=fit.samples,
        intervals={k: list(v) for k, v in fit.intervals.items()},
        extras=extras.to_json() if extras else {},
        shapes=_shape_rows(result, fit, profile.mu_per_replica_minute),
        engine=result.engine_url,
        engine_version=settings.BENCHMARK_ENGINE_VERSION,
        started_at=started,
        finished_at=timezone.now(),
    )
    if publish:
        # The coefficients price requests; what a pool holds depends only on MU and GPUs per
        # replica, which a fit does not touch, so publishing cannot oversell.
        _publish(profile, fit, record)
        record.status = ProfileFit.Status.PUBLISHED
    if profile.pk is None:
        return record  # refused: nothing to attach the record to
    terms = price_terms(fit)
    detail = {
        "profile": profile.pk,
        "link": profile_link(profile),
        "fit": record.pk,
        "status": record.status,
        "r2": fit.r2,
        "heldout_mape": fit.heldout_mape,
        "engine": record.engine,
    }
    with transaction.atomic():
        record.save()
        detail["fit"] = record.pk
        if record.status == ProfileFit.Status.PUBLISHED:
            ModelProfile.objects.filter(pk=profile.pk).update(
                benchmark_claimed_at=None,
                benchmark_requested_at=None,
                benchmark_failures=0,
                benchmark_retry_at=None,
                benchmark_streak_event_id=None,
                benchmark_streak_paged=False,
            )
            Event.record(
                Event.Kind.BENCHMARK,
                f"The benchmark of {profile} published a new price ({profile_link(profile)}): {terms}."
                f" {reason}",
                severity=Event.Severity.INFO,
                reported_by="benchmark",
                detail=detail,
            )
        else:
            _extend_streak(profile, f"measured a price that was refused: {reason}", detail, False, terms)
    return record


def _publish(profile: ModelProfile, fit: Fit, record: ProfileFit) -> None:
    if profile.pk is not None:
        profile.refresh_from_db()
    # From the fit, not the record: the same figures, but a record's may be None (a failed run's).
    profile.alpha, profile.beta, profile.gamma = fit.alpha, fit.beta, fit.gamma
    profile.rho, profile.kappa = fit.rho, fit.kappa
    if record.delta is not None:
        profile.delta = record.delta
    if record.cached_token_factor is not None:
        profile.cached_token_factor = record.cached_token_factor
    profile.r2, profile.samples, profile.heldout_mape = fit.r2, fit.samples, fit.heldout_mape
    profile.fitted_at, profile.source = record.finished_at, ModelProfile.Source.BENCHMARK
    profile.engine, profile.engine_version = record.engine, record.engine_version
    profile.save()


def _record_failure(
    profile: ModelProfile, started: datetime, error: str, result: SweepResult | None, unreachable: bool
) -> ProfileFit:
    record = ProfileFit(
        profile=profile,
        status=ProfileFit.Status.FAILED,
        reason=error,
        engine=result.engine_url if result else "",
        engine_version=settings.BENCHMARK_ENGINE_VERSION,
        started_at=started,
        finished_at=timezone.now(),
    )
    log.warning("benchmark of %s failed: %s", profile, error)
    if profile.pk is None:  # a new model's profile (the command's --create-model): made only by a fit
        return record
    with transaction.atomic():
        record.save()
        detail = {
            "profile": profile.pk,
            "link": profile_link(profile),
            "fit": record.pk,
            "status": record.status,
            "error": error,
        }
        _extend_streak(profile, f"failed: {error}", detail, unreachable)
    return record


def retry_in_s(failures: int) -> int:
    """Seconds before the next try after `failures` in a row: 60, 120, 240, ... up to the cap."""
    return int(
        min(settings.BENCHMARK_RETRY_BASE_S * 2 ** min(failures - 1, 40), settings.BENCHMARK_RETRY_MAX_S)
    )


def _extend_streak(
    profile: ModelProfile, what: str, detail: dict[str, object], unreachable: bool, terms: str = ""
) -> None:
    """One more failed or refused attempt in a row: back off, and bring the streak's one event up
    to date (a new one only for the streak's first attempt, and once, critical, for the first
    time the engine itself was unreachable). Inside the caller's transaction. The message says
    what happened first, then the profile's address, then what was measured (`terms`)."""
    row = ModelProfile.objects.select_for_update().get(pk=profile.pk)
    failures = row.benchmark_failures + 1
    retry_in = retry_in_s(failures)
    message = (
        f"The benchmark of {profile} {what}. The current price stays; {failures}"
        f" attempt{'s' if failures > 1 else ''} in a row, next in {_duration(retry_in)}"
        f" ({profile_link(profile)})." + (f" Measured: {terms}." if terms else "")
    )
    detail = {**detail, "count": failures, "failures": failures, "retry_in_s": retry_in}
    event_id, paged = row.benchmark_streak_event_id, row.benchmark_streak_paged
    if unreachable and not paged:
        event_id, paged = _streak_event(message, detail, Event.Severity.CRITICAL), True
    elif event_id is None or not Event.objects.filter(pk=event_id).update(message=message, detail=detail):
        event_id = _streak_event(message, detail, Event.Severity.WARNING)
    done = {"benchmark_requested_at": None} if detail.get("status") == ProfileFit.Status.REFUSED else {}
    ModelProfile.objects.filter(pk=profile.pk).update(
        **done,
        benchmark_claimed_at=None,
        benchmark_failures=failures,
        benchmark_retry_at=timezone.now() + timedelta(seconds=retry_in),
        benchmark_streak_event_id=event_id,
        benchmark_streak_paged=paged,
    )


def profile_link(profile: ModelProfile) -> str:
    """Where an operator reads the profile: its row on the console's capacity page."""
    return f"{reverse('console:capacity')}#profile-{profile.pk}"


def price_terms(fit: Fit) -> str:
    """A fit's coefficients for people, each with its unit and then its name (the console's
    numbers, capacity.numbers: 6.81 x 10⁻⁵, never 6.81e-05)."""
    terms = (
        f"{numbers.shown(fit.alpha)} MU per input token (alpha), {numbers.shown(fit.beta)} MU per"
        f" output token (beta), {numbers.shown(fit.gamma)} MU per request (gamma)"
    )
    if fit.rho or fit.kappa:
        terms += (
            f"; for long requests {numbers.shown(fit.rho)} MU per input token x log2(output tokens)"
            f" (rho), {numbers.shown(fit.kappa)} MU per KV-cache token-step (kappa)"
        )
    return terms


def _streak_event(message: str, detail: dict[str, object], severity: str) -> int:
    return Event.record(
        Event.Kind.BENCHMARK, message, severity=severity, reported_by="benchmark", detail=detail
    ).pk


def _duration(seconds: int) -> str:
    """60 -> "60 s", 240 -> "4 min", 14400 -> "4 h"."""
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:g} h"


def _shape_rows(result: SweepResult, fit: Fit, mu: int) -> list[dict[str, float | int | str]]:
    rows: list[dict[str, float | int | str]] = []
    for s in result.shapes:
        cost = mu / s.sustainable_per_minute if s.sustainable_per_minute else None
        rows.append(
            {
                "input_tokens": s.input_tokens,
                "output_tokens": s.output_tokens,
                "requests_per_minute": round(s.sustainable_per_minute, 3),
                "solo_latency_s": round(s.solo_latency_s, 4),
                "cost_mu": round(cost, 6) if cost else "",
                "fitted_mu": round(fit.predict(s.input_tokens, s.output_tokens), 6),
                # A client-bound shape is not priced from: its residual would be the client's.
                "residual": round(fit.predict(s.input_tokens, s.output_tokens) / cost - 1, 4)
                if cost and not s.client_bound
                else "",
                "note": s.note,
                "client_bound": s.client_bound,
            }
        )
    return rows


def _ready(supervisor, name: str) -> bool:  # type: ignore[no-untyped-def]
    supervisor.check_once()
    return any(p.name == name and p.ready for p in supervisor.list_pods())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
