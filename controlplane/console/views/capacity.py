"""The capacity section (operators only): pools and their ledgers summed per GPU type, with the
history chart, the model profiles with their latest benchmarks, and selling a reservation."""

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Avg, Prefetch, QuerySet
from django.db.models.functions import TruncHour, TruncMinute
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from capacity.ledger import Oversold, PoolLedger
from capacity.packing import ReplicaDemand, defrag_plan
from controlplane import selling
from controlplane.api.errors import oversold_body
from controlplane.api.serializers import ReservationSerializer
from controlplane.capacity.models import CapacitySnapshot, GpuPool, ModelProfile, ProfileFit, Reservation
from controlplane.console import charts
from controlplane.console.views.base import ConsoleRequest, console_view, page
from controlplane.endpoints.models import Endpoint

WINDOWS = {  # name -> (length, bucket)
    "hour": (timedelta(hours=1), TruncMinute),
    "day": (timedelta(days=1), TruncHour),
    "week": (timedelta(days=7), TruncHour),
}


@console_view(operator_only=True, section="capacity")
def capacity(request: ConsoleRequest) -> HttpResponse:
    return page(
        request,
        "console/capacity.html",
        "console/_capacity_pools.html",
        capacity_context(request.GET.get("window", "hour")),
    )


def capacity_context(window: str) -> dict[str, Any]:
    window = window if window in WINDOWS else "hour"
    now = timezone.now()
    pools = list(GpuPool.objects.select_related("gpu_type").order_by("gpu_type__name", "name"))
    ledgers = selling.pool_ledgers(pools)
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
            },
        )
        group["pools"].append(
            {
                "pool": pool,
                "ledger": ledger,
                "grid": node_grid(ledger),
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
    length, bucket = WINDOWS[window]
    since = now - length
    history: dict[str, dict[datetime, dict[str, float]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(float))
    )
    rows = (
        CapacitySnapshot.objects.filter(at__gte=since)
        .annotate(bucket=bucket("at"))
        .values("pool__gpu_type__name", "pool_id", "bucket")
        .annotate(
            have=Avg("have_mu_per_minute"), sold=Avg("sold_mu_per_minute"), used=Avg("used_mu_per_minute")
        )
        .order_by()
    )
    for row in rows:  # average within a bucket per pool, then add the pools of a GPU type
        point = history[row["pool__gpu_type__name"]][row["bucket"]]
        for figure in ("have", "sold", "used"):  # not `key` (a plain str above): a row takes literal keys
            point[figure] += row[figure]
    for name, group in groups.items():
        buckets = sorted(history[name].items())
        group["chart"] = charts.line_chart(
            charts.Chart(
                title=f"{name}: MU/min over the last {window}",
                series=[
                    charts.Series(label, [(t.timestamp(), p[key]) for t, p in buckets], css)
                    for label, key, css in [
                        ("have", "have", "have"),
                        ("sold", "sold", "sold"),
                        ("used", "used", "used"),
                    ]
                ],
            ),
            since.timestamp(),
            now.timestamp(),
        )
    return {
        "groups": list(groups.values()),
        "profiles": profiles_with_history(),
        "window": window,
        "windows": list(WINDOWS),
        "overcommit": next(iter(ledgers.values())).overcommit if ledgers else 1,
    }


def node_grid(ledger: PoolLedger) -> dict[str, Any]:
    """The pool's packing for people (templates/console/_node_grid.html): runs of nodes with the
    same content as one row of GPU cells (the packing orders nodes by content, so a fleet of
    1,000 nodes is a few rows), and per model placed there the replicas that still fit, with a
    defragmentation plan where a replica fits only after moving others (capacity.packing
    .defrag_plan; shown, never carried out)."""
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
                ledger.demands,
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
        context["refused"] = oversold_body(refused)
        return render(request, "console/_sell_form.html", context, status=409)
    # The pools table is refreshed in the same response (out of band), with the new figures.
    context.update(capacity_context(request.POST.get("window", "hour")), refresh_pools=True)
    return render(request, "console/_sell_form.html", context)
