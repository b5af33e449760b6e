"""The capacity section (operators only): pools and their stored ledgers summed per GPU type,
with the history chart, each pool's node grid on demand, the endpoints that hold the most, the
model profiles with their latest benchmarks, and selling a reservation. The page reads what the
writes stored (controlplane.pool_ledgers.stored_ledgers), so its cost follows the pools and the ten
holders it shows, not the endpoints behind them; a node grid reads its one pool live."""

import copy
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Prefetch, QuerySet
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from capacity.autoscaler import forecast
from capacity.ledger import Oversold, PoolLedger, check_change, more_replicas_after
from capacity.packing import ReplicaDemand, defrag_plan
from controlplane import pool_ledgers, selling, tenant_limits
from controlplane.api import params
from controlplane.api.errors import oversold_body
from controlplane.api.serializers import ReservationSerializer
from controlplane.capacity.models import (
    GpuPool,
    ModelProfile,
    ProfileFit,
    Reservation,
    StoredLedger,
)
from controlplane.console import charts
from controlplane.console.history import (
    capacity_history,
    forecast_wait,
    history_gap_s,
    hourly_peaks,
    snapshot_interval_s,
    tenant_usage,
)
from controlplane.console.views.base import ConsoleRequest, console_view, page
from controlplane.endpoints.models import Endpoint

TOP_ENDPOINTS = 10  # "the endpoints that hold the most": how many the page lists
SUGGESTIONS = 20  # endpoints the sell form suggests as the operator types
FORECAST_HOURS = 24  # the forecast line covers the next day, hour by hour


@console_view(operator_only=True, section="capacity")
def capacity(request: ConsoleRequest) -> HttpResponse:
    context = capacity_context(request.GET.get("window"))
    context.update(planning_context(timezone.now(), context["stored_ledgers"]))
    return page(request, "console/capacity.html", "console/_capacity_pools.html", context)


def capacity_context(window: str | None) -> dict[str, Any]:
    """The pools' ledgers summed per GPU type, each with its history chart and forecast.

    The ledgers are the stored ones (pool_ledgers.stored_ledgers), which /api/v1/capacity/ answers
    from: the page and the API show the same figures. No placement: a pool's node grid is its
    own request (pool_nodes)."""
    window = charts.window_name(window)
    now = timezone.now()
    pools = list(GpuPool.objects.select_related("gpu_type").order_by("gpu_type__name", "name"))
    stored = pool_ledgers.stored_ledgers(pools)
    ledgers = {pool.pk: stored[pool.pk].ledger() for pool in pools}
    groups: dict[str, dict[str, Any]] = {}
    for pool in pools:
        ledger = ledgers[pool.pk]
        group = groups.setdefault(
            pool.gpu_type.name,
            {
                "gpu_type": pool.gpu_type,
                "pools": [],
                "have_gpus": 0,
                "committed_gpus": 0,
                "sold_gpus": 0,
                "used_gpus": 0,
                "have_mu": 0,
                "committed_mu": 0,
                "sold_mu": 0,
                "used_mu": 0,
                "sellable_gpus": 0,
                "sellable_mu": 0,
            },
        )
        group["pools"].append(
            {
                "pool": pool,
                "ledger": ledger,
                # Headroom per model placed in the pool: MU/min, and whole replicas of it; and
                # what it alone would fill the pool with (a pool's MU/min is read per model).
                "models": [
                    {
                        "model": m.model,
                        "have_mu": m.have_mu_per_minute,
                        "headroom_mu": m.headroom_mu_per_minute,
                        "replicas": m.more_replicas,
                        "gpus_per_replica": m.shape.gpus_per_replica,
                    }
                    for m in ledger.models
                ],
                # The bar's "sold" is what the pool is checked on: committed (capacity.ledger).
                "bar": charts.capacity_bar(
                    float(ledger.have_gpus),
                    float(ledger.sellable_gpus),
                    float(ledger.committed_gpus),
                    float(ledger.used_gpus),
                ),
            }
        )
        for key, value in [
            ("have_gpus", ledger.have_gpus),
            ("committed_gpus", ledger.committed_gpus),
            ("sold_gpus", ledger.sold_gpus),
            ("used_gpus", ledger.used_gpus),
            ("sellable_gpus", ledger.sellable_gpus),
            ("have_mu", ledger.have_mu_per_minute),
            ("committed_mu", ledger.committed_mu_per_minute),
            ("sold_mu", ledger.sold_mu_per_minute),
            ("used_mu", ledger.used_mu_per_minute),
            ("sellable_mu", ledger.sellable_mu_per_minute),
        ]:
            group[key] += value
    for group in groups.values():
        group["bar"] = charts.capacity_bar(
            float(group["have_gpus"]),
            float(group["sellable_gpus"]),
            float(group["committed_gpus"]),
            float(group["used_gpus"]),
        )
        group["oversold"] = group["committed_gpus"] > group["sellable_gpus"]
    since = now - timedelta(seconds=charts.WINDOWS[window])
    history = capacity_history(since, charts.WINDOWS[window])
    gap_s = history_gap_s(charts.WINDOWS[window])
    peaks = hourly_peaks(now)
    history_charts = {
        name: charts.Chart(
            title=f"{name}: MU/min over the last {window}",
            series=[
                charts.Series(label, [(t, p[label]) for t, p in history.get(name, [])], label, gap_s=gap_s)
                for label in ("have", "sold", "used")
            ],
            unit="MU/min",
            empty=f"No snapshots of {name}'s pools in the last {window}: the chart starts with the "
            f"first, and each pool is snapshotted every {snapshot_interval_s():.0f} s.",
        )
        for name in groups
    }
    # One time axis for every GPU type's chart: their minutes line up down the page.
    drawn = charts.on_one_axis(history_charts.values(), since.timestamp(), now.timestamp())
    for (name, group), chart in zip(groups.items(), drawn, strict=True):
        group["chart"] = chart
        group.update(forecast_of(name, peaks.get(name, []), float(group["sellable_mu"]), now.timestamp()))
    return {
        "groups": list(groups.values()),
        "profiles": profiles_with_history(),
        "window": window,
        "windows": list(charts.WINDOWS),
        "overcommit": next(iter(ledgers.values())).overcommit if ledgers else 1,
        "stored_ledgers": stored,  # the holders (planning_context) are read from them too
    }


@console_view(operator_only=True, section="capacity")
def pool_nodes(request: ConsoleRequest, pk: int) -> HttpResponse:
    """One pool's node grid (templates/console/_node_grid.html), loaded when its <details> on
    the capacity page opens: the pool read live with its named placement, so its cost is the
    pool's endpoints, not the fleet's."""
    pool = get_object_or_404(GpuPool.objects.select_related("gpu_type"), pk=pk)
    ledger = pool_ledgers.pool_ledgers([pool])[pool.pk]
    row = {"pool": pool, "ledger": ledger, "grid": node_grid(ledger)}
    return render(request, "console/_node_grid.html", {"row": row})


def node_grid(ledger: PoolLedger) -> dict[str, Any]:
    """The pool's packing for people (templates/console/_node_grid.html): runs of nodes with the
    same content as one row of GPU cells (the packing orders nodes by content, so a fleet of
    1,000 nodes is a few rows), and per model placed there the replicas that still fit, with a
    defragmentation plan where a replica fits only after moving others (capacity.packing
    .defrag_plan; shown, never carried out). `ledger` is a pool read live (pool_ledgers.pool_ledgers):
    a stored one keeps no placement."""
    demands = ledger.demands
    if demands is None:
        raise ValueError("a node grid draws a pool read live, not its stored ledger")
    colours = {m.model: i % 8 for i, m in enumerate(ledger.models)}
    runs: list[dict[str, Any]] = []
    for node in ledger.nodes:
        content = tuple((r.label, r.model, r.gpus) for r in node.replicas)
        if runs and runs[-1]["content"] == content:
            runs[-1]["last"] = node.index + 1
            runs[-1]["count"] += 1
            continue
        cells = [
            {"label": label, "model": model, "css": f"m{colours.get(model, 0)}", "first": i == 0}
            for label, model, gpus in content
            for i in range(gpus)
        ]
        cells += [{"label": "", "model": "", "css": "free", "first": False}] * node.free_gpus
        runs.append(
            {"content": content, "first": node.index + 1, "last": node.index + 1, "count": 1, "cells": cells,
             "free_gpus": node.free_gpus}
        )  # fmt: skip
    labels = {r.key: r.label for node in ledger.nodes for r in node.replicas}
    models = []
    for m in ledger.models:
        plan: list[str] | None = None
        if m.more_replicas == 0 and ledger.free_gpus >= m.shape.gpus_per_replica:
            moves = defrag_plan(
                ledger.node_count,
                ledger.node_shape,
                demands,
                ReplicaDemand("wanted", m.model, m.shape.gpus_per_replica, 1),
            )
            plan = (
                [
                    f"move a {mv.gpus}-GPU replica of {labels.get(mv.key, mv.key)} from node"
                    f" {mv.from_node + 1} to node {mv.to_node + 1}"
                    for mv in moves
                ]
                if moves
                else None
            )
        models.append({"capacity": m, "css": f"m{colours[m.model]}", "defrag": plan})
    return {"runs": runs, "models": models}


def forecast_of(
    name: str, peaks: list[tuple[float, float]], sellable_mu: float, now: float
) -> dict[str, Any]:
    """The next day's forecast, hour by hour, from the same hours of the previous days and weeks
    (capacity.autoscaler.forecast.predicted_peak: the median of their peaks, so a one-off spike
    does not move it), drawn against what the GPU type may sell. No forecast without two days
    (or two weeks) of history."""
    hour = 3600.0
    start = now // hour * hour
    points = [
        (t, peak)
        for t in (start + k * hour for k in range(FORECAST_HOURS + 1))
        if (peak := forecast.predicted_peak(peaks, t, lead_s=0.0, horizon_s=hour)) is not None
    ]
    chart = charts.line_chart(
        charts.Chart(
            title=f"{name}: forecast peak MU/min for the next {FORECAST_HOURS} h, "
            "from the previous days' and weeks' peaks",
            series=[
                charts.Series("forecast peak", points, "used", gap_s=hour),
                charts.Series(
                    "sellable", [(start, sellable_mu), (start + FORECAST_HOURS * hour, sellable_mu)], "have"
                ),
            ],
            unit="MU/min",
        ),
        start,
        start + FORECAST_HOURS * hour,
    )
    top = max((v for _, v in points), default=None)
    return {
        # A sellable line alone is no forecast: say what is missing and when it will show.
        "forecast_chart": chart if points else charts.empty_state(forecast_wait(name, peaks, now)),
        "forecast_peak": top,
        "forecast_short": top is not None and top > sellable_mu,
    }


def planning_context(now: datetime, stored: dict[int, StoredLedger]) -> dict[str, Any]:
    """The endpoints that hold the most of the fleet and each tenant's usage against what it
    bought. The holders are the stored ledgers' (each pool's ten, merged: pool_ledgers.holding_most),
    their committed and running GPUs as stored; one query reads those endpoints for the rest."""
    rows = pool_ledgers.holding_most(h for s in stored.values() for h in s.holders)[:TOP_ENDPOINTS]
    endpoints = Endpoint.objects.select_related("tenant", "profile", "pool", "reservation").in_bulk(
        [endpoint_id for endpoint_id, *_ in rows]
    )
    holders = []
    for endpoint_id, committed_gpus, committed_mu, running_gpus in rows:
        e = endpoints.get(endpoint_id)
        if e is None:  # deleted between the two reads (its delete refreshed the ledger since)
            continue
        reservation = getattr(e, "reservation", None)  # a reverse one-to-one: absent raises
        holders.append(
            {
                "endpoint": e,
                "reserved": reservation.mu_per_minute if reservation else 0,
                "committed_gpus": committed_gpus,
                "committed_mu": committed_mu,
                "running_gpus": running_gpus,
                "min_replicas": e.replica_bounds[0],
            }
        )
    return {"holders": holders, "tenant_usage": tenant_usage(now)}


def profiles_with_history() -> QuerySet[ModelProfile]:
    """Profiles with their five latest benchmarks, in two queries."""
    recent = Prefetch("fits", queryset=ProfileFit.objects.order_by("-id")[:5], to_attr="recent_fits")
    return (
        ModelProfile.objects.select_related("gpu_type")
        .prefetch_related(recent)
        .order_by("model", "gpu_type__name")
    )


@require_POST
@console_view(operator_only=True, section="capacity")
def rerun_benchmark(request: ConsoleRequest, pk: int) -> HttpResponse:
    """The re-run button: ask for a benchmark; the next beat tick runs it."""
    ModelProfile.objects.filter(pk=pk).update(benchmark_requested_at=timezone.now(), benchmark_retry_at=None)
    profile = get_object_or_404(profiles_with_history(), pk=pk)
    return render(request, "console/_profile_row.html", {"p": profile})


@require_POST
@console_view(operator_only=True, section="capacity")
def sell(request: ConsoleRequest) -> HttpResponse:
    """Sell or change a reservation from the capacity page; an oversell shows its numbers."""
    form: dict[str, Any] = {k: request.POST.get(k, "").strip() for k in ("endpoint", "mu_per_minute")}
    form["best_effort_allowed"] = request.POST.get("best_effort_allowed") == "on"
    tenant_name, _, endpoint_name = form["endpoint"].partition("/")
    endpoint = (
        Endpoint.objects.visible_to(request.principal)
        .with_related()
        .filter(tenant__name=tenant_name, name=endpoint_name)
        .first()
    )
    context: dict[str, Any] = {"form": form, "errors": {}, "refused": None, "sold": None}
    if endpoint is None:
        context["errors"]["endpoint"] = f"no endpoint {form['endpoint']!r}: write it as tenant/endpoint"
        return render(request, "console/_sell_form.html", context, status=400)
    existing = Reservation.objects.filter(endpoint=endpoint).first()
    serializer = ReservationSerializer(
        existing,
        data={
            "endpoint": endpoint.pk,
            "mu_per_minute": form["mu_per_minute"],
            "best_effort_allowed": form["best_effort_allowed"],
        },
        context={"principal": request.principal},
    )
    if not serializer.is_valid():
        context["errors"] = {field: " ".join(map(str, errors)) for field, errors in serializer.errors.items()}
        return render(request, "console/_sell_form.html", context, status=400)
    try:
        with transaction.atomic():
            context["sold"] = serializer.save()
    except Oversold as refused:
        context["refused"] = oversold_body(refused, operator=True)  # operators sell
        return render(request, "console/_sell_form.html", context, status=409)
    # The pools table is refreshed in the same response (out of band), with the new figures.
    context.update(capacity_context(request.POST.get("window")), refresh_pools=True)
    context.update(planning_context(timezone.now(), context["stored_ledgers"]))
    return render(request, "console/_sell_form.html", context)


@console_view(operator_only=True, section="capacity")
def sell_endpoints(request: ConsoleRequest) -> HttpResponse:
    """The sell form's suggestions (its endpoint input's <datalist>) as the operator types: at
    most SUGGESTIONS endpoints, each as tenant/endpoint with its model, pool and reservation, by
    tenant then name. "tenant/pre": that tenant's endpoints whose name starts with "pre" (the
    tenant's name index, then its endpoints); "pre": those of the tenants whose name starts with
    it (read in the order of the tenant names' index, stopping at the SUGGESTIONS-th), then, when
    fewer, the endpoints whose own name does (a scan of the endpoints' names: no index has them
    first)."""
    text = request.GET.get("endpoint", "").strip()
    tenant_name, slash, name = text.partition("/")
    endpoints = (
        Endpoint.objects.visible_to(request.principal)
        .select_related("tenant", "profile", "pool", "reservation")
        .order_by("tenant__name", "name")
    )
    if slash:
        suggestions = list(endpoints.filter(tenant__name=tenant_name, name__startswith=name)[:SUGGESTIONS])
    else:
        suggestions = list(endpoints.filter(tenant__name__startswith=text)[:SUGGESTIONS])
        if len(suggestions) < SUGGESTIONS:
            suggestions += endpoints.filter(name__startswith=text).exclude(tenant__name__startswith=text)[
                : SUGGESTIONS - len(suggestions)
            ]
            suggestions.sort(key=lambda e: (e.tenant.name, e.name))
    return render(request, "console/_sell_endpoints.html", {"suggestions": suggestions})


@console_view(operator_only=True, section="capacity")
def preview(request: ConsoleRequest) -> HttpResponse:
    """What a sale, or a change of the endpoint's minimum provisioned concurrency, would leave in
    its pool: committed and headroom before and after, in GPUs and in each model's MU/min, and
    whether the pool takes it (capacity.ledger.check_change, the rule a sale meets). Nothing is
    written."""
    tenant_name, _, endpoint_name = request.GET.get("endpoint", "").partition("/")
    endpoint = (
        Endpoint.objects.with_related().filter(tenant__name=tenant_name, name=endpoint_name).first()
        if endpoint_name
        else None
    )
    if endpoint is None:
        return render(request, "console/_sell_preview.html", {"preview": None})
    reservation = getattr(endpoint, "reservation", None)
    reserved_now = reservation.mu_per_minute if reservation else 0
    errors: dict[str, str] = {}
    mu = _whole(request.GET.get("mu_per_minute"), reserved_now, "mu_per_minute", errors)
    minimum = _whole(
        request.GET.get("min_provisioned_concurrency"),
        endpoint.min_provisioned_concurrency,
        "min_provisioned_concurrency",
        errors,
    )
    if minimum > endpoint.max_provisioned_concurrency:
        errors["min_provisioned_concurrency"] = (
            f"must not exceed the maximum, {endpoint.max_provisioned_concurrency}, got {minimum}"
        )
    if errors:
        return render(request, "console/_sell_preview.html", {"preview": None, "errors": errors}, status=400)
    # The pool's alike endpoints grouped, this one apart (under its own key, which the what-ifs
    # replace): the figures of the per-endpoint ledger from tens of rows, not the pool's every one.
    groups = pool_ledgers.alike_groups(endpoint.pool, changed=endpoint.pk)
    ledger = pool_ledgers.grouped_ledger(endpoint.pool, groups, changed=endpoint.pk)
    replacing = tenant_limits.commitment(endpoint, reserved_now)
    changed = copy.copy(endpoint)
    changed.min_provisioned_concurrency = minimum
    asked = tenant_limits.commitment(changed, mu)
    key = selling.demand_key(endpoint)
    committed_after = ledger.committed_gpus - replacing.gpus + asked.gpus
    headroom_after = ledger.sellable_gpus - committed_after
    refusal = ""  # what a Sell of this would be refused with, in the same words
    try:
        check_change(endpoint.pool.name, ledger, key, endpoint.profile.model, asked, replacing)
        fits = True
    except Oversold as refused:
        fits, refusal = False, str(refused)
    preview = {
        "endpoint": endpoint,
        "pool": endpoint.pool,
        "ledger": ledger,
        "mu": mu,
        "reserved_now": reserved_now,
        "minimum": minimum,
        "min_replicas": changed.replica_bounds[0],
        "replacing": replacing,
        "asked": asked,
        "committed_after": committed_after,
        "headroom_after": headroom_after,
        "fits": fits,
        "refusal": refusal,
        "models": [
            {
                "model": m.model,
                "before": m.headroom_mu_per_minute,
                "after": more_replicas_after(
                    ledger, key, endpoint.profile.model, asked, m.shape.gpus_per_replica
                )
                * m.shape.mu_per_replica_minute
                * m.overcommit,
            }
            for m in ledger.models
        ],
    }
    return render(request, "console/_sell_preview.html", {"preview": preview})


def _whole(raw: str | None, default: int, name: str, errors: dict[str, str]) -> int:
    """A whole number >= 0 from a query value, `default` when blank; a bad one is named in errors."""
    if raw is None or raw.strip() == "":
        return default
    try:
        return params.integer(name, raw.strip(), 0, 10**9)
    except params.ParameterError as exc:
        errors[name] = exc.message
        return default
