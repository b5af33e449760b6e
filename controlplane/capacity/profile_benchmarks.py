"""Benchmarks from the control plane: which profiles are due, one at a time, and their history.

`run_benchmark(profile)` measures a model x GPU pair (capacity.benchmark.sweep), fits its price
(capacity.fitting), keeps every attempt as a ProfileFit, publishes a good fit as the profile's
coefficients, and writes a benchmark Event either way. A profile is due when it was never
benchmarked, its fit is older than BENCHMARK_MAX_AGE_S, the engine version changed, or an
operator asked for a re-run. Claims are filtered updates (two workers never measure one pair);
failures back off (60 s, 120 s, ... up to a day) and never leave an engine pod running.
"""

import asyncio
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from capacity.benchmark.config import DEFAULT_SHAPES, Slo, SweepConfig
from capacity.benchmark.drivers import Driver
from capacity.benchmark.results import BenchmarkError, SweepResult
from capacity.benchmark.sweep import sweep
from capacity.fitting import Fit
from controlplane.capacity.models import ModelProfile, ProfileFit
from controlplane.oncall.models import Event

log = logging.getLogger("controlplane.capacity.profile_benchmarks")


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


@contextmanager
def benchmark_engine(
    profile: ModelProfile, engine_url: str | None = None
) -> Iterator[tuple[str, float, str]]:
    """(engine URL, time scale, what to call it) for this pair; a local simulated pod is stopped
    whatever happens, and its fits say "simulated" so they are never mistaken for a GPU's."""
    url = engine_url or settings.BENCHMARK_ENGINE_URL
    if url:
        yield url, 1.0, url
        return
    from controlplane.endpoints import scaling

    cluster = scaling.driver()
    if cluster is not None:
        yield cluster_engine(cluster, profile)
        return  # the claim's release undeclares the pod: the next pass removes it
    if not settings.BENCHMARK_SIMULATED_PROFILE:
        raise BenchmarkError(None, "no engine: set BENCHMARK_ENGINE_URL (or BENCHMARK_SIMULATED_PROFILE)")
    from dataplane.runtime.pod_process import PodLaunch
    from dataplane.runtime.supervisor import Supervisor

    supervisor = Supervisor()
    port, probe_port = _free_port(), _free_port()
    name = f"benchmark-{profile.pk}-{port}"
    scale = settings.BENCHMARK_SIMULATED_TIME_SCALE
    supervisor.start_pod(
        PodLaunch(
            name,
            "sim",
            port,
            probe_port,
            args=("--profile", settings.BENCHMARK_SIMULATED_PROFILE, "--time-scale", str(scale)),
        )
    )
    try:
        deadline = time.monotonic() + 30
        while not _ready(supervisor, name):
            if time.monotonic() > deadline:
                raise BenchmarkError(None, f"benchmark pod {name} was not ready within 30 s")
            time.sleep(0.1)  # waiting on a process starting, not faking time
        label = f"simulated:{settings.BENCHMARK_SIMULATED_PROFILE} (local pod, time scale {scale:g})"
        yield f"http://127.0.0.1:{port}", scale, label
    finally:
        supervisor.stop_pod(name, grace_s=5)
        supervisor.close()


def cluster_engine(cluster, profile: ModelProfile) -> tuple[str, float, str]:  # type: ignore[no-untyped-def]
    """The benchmark deployment's pod, once ready: the autoscaler's pass declares it for as long
    as this benchmark holds the profile's claim."""
    from controlplane.endpoints.deployments import benchmark_deployment_name, sim_profile

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
            )
        time.sleep(0.5)  # waiting on the cluster, not faking time
    vllm = settings.BENCHMARK_POD_ENGINE == "vllm"
    scale = 1.0 if vllm else settings.BENCHMARK_SIMULATED_TIME_SCALE
    simulated = settings.BENCHMARK_SIMULATED_PROFILE or sim_profile(profile.gpu_type.name)
    engine = "vllm" if vllm else f"simulated:{simulated}"
    return ready[0].url, scale, f"{engine} (cluster pod {ready[0].name}, time scale {scale:g})"


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
    try:
        if driver is not None:  # an in-process engine (the simulated performance model)
            result = asyncio.run(sweep(driver, config, slo()))
        else:
            with benchmark_engine(profile, engine_url) as (url, scale, label):
                config = SweepConfig(**{**asdict(config), "time_scale": scale})
                result = replace(asyncio.run(sweep(url, config, slo())), engine_url=label)
        fit = result.fit(profile.mu_per_replica_minute)
    except (BenchmarkError, ValueError) as error:
        return _record_failure(profile, started, str(error), result)
    publish, reason = fit.verdict(settings.BENCHMARK_MAX_HELDOUT_MAPE)
    record = ProfileFit(
        profile=profile,
        status=ProfileFit.Status.REFUSED,
        reason=reason,
        alpha=fit.alpha,
        beta=fit.beta,
        gamma=fit.gamma,
        r2=fit.r2,
        heldout_mape=fit.heldout_mape,
        samples=fit.samples,
        intervals={k: list(v) for k, v in fit.intervals.items()},
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
    with transaction.atomic():
        record.save()
        ModelProfile.objects.filter(pk=profile.pk).update(
            benchmark_claimed_at=None,
            benchmark_requested_at=None,
            benchmark_failures=0,
            benchmark_retry_at=None,
        )
        Event.record(
            Event.Kind.BENCHMARK,
            f"{profile}: fit {record.status} (alpha {fit.alpha:.3g}, beta {fit.beta:.3g},"
            f" gamma {fit.gamma:.3g}; {reason})",
            severity=Event.Severity.INFO
            if record.status == ProfileFit.Status.PUBLISHED
            else Event.Severity.WARNING,
            reported_by="benchmark",
            detail={
                "profile": profile.pk,
                "fit": record.pk,
                "status": record.status,
                "r2": fit.r2,
                "heldout_mape": fit.heldout_mape,
                "engine": record.engine,
            },
        )
    return record


def _publish(profile: ModelProfile, fit: Fit, record: ProfileFit) -> None:
    if profile.pk is not None:
        profile.refresh_from_db()
    # From the fit, not the record: the same figures, but a record's may be None (a failed run's).
    profile.alpha, profile.beta, profile.gamma = fit.alpha, fit.beta, fit.gamma
    profile.r2, profile.samples, profile.heldout_mape = fit.r2, fit.samples, fit.heldout_mape
    profile.fitted_at, profile.source = record.finished_at, ModelProfile.Source.BENCHMARK
    profile.engine, profile.engine_version = record.engine, record.engine_version
    profile.save()


def _record_failure(
    profile: ModelProfile, started: datetime, error: str, result: SweepResult | None
) -> ProfileFit:
    failures = profile.benchmark_failures + 1
    retry_in = min(settings.BENCHMARK_RETRY_BASE_S * 2 ** (failures - 1), 86400)
    with transaction.atomic():
        record = ProfileFit.objects.create(
            profile=profile,
            status=ProfileFit.Status.FAILED,
            reason=error,
            engine=result.engine_url if result else "",
            engine_version=settings.BENCHMARK_ENGINE_VERSION,
            started_at=started,
            finished_at=timezone.now(),
        )
        ModelProfile.objects.filter(pk=profile.pk).update(
            benchmark_claimed_at=None,
            benchmark_failures=failures,
            benchmark_retry_at=timezone.now() + timedelta(seconds=retry_in),
        )
        Event.record(
            Event.Kind.BENCHMARK,
            f"{profile}: benchmark failed ({error}); the current profile stays; retry in {retry_in} s",
            severity=Event.Severity.CRITICAL,
            reported_by="benchmark",
            detail={
                "profile": profile.pk,
                "fit": record.pk,
                "error": error,
                "failures": failures,
                "retry_in_s": retry_in,
            },
        )
    log.warning("benchmark of %s failed: %s", profile, error)
    return record


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
                "note": s.note,
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
