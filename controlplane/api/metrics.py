"""`GET /api/v1/metrics/`: the control plane's own Prometheus metrics, for operators' keys.

What only the control plane knows: each profile's benchmark failure streak (consecutive failed
benchmarks, `ModelProfile.benchmark_failures`, reset by a success) and on-call's unresolved
groups by kind and severity. The PrometheusRule in docker/k8s/monitoring alerts on the streak;
Prometheus scrapes this with an operator key (its ServiceMonitor's bearer token).
"""

from django.db.models import Count
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import permissions
from rest_framework.request import Request
from rest_framework.views import APIView

from controlplane.api.permissions import OperatorOnly
from controlplane.capacity.models import ModelProfile
from controlplane.oncall.models import EventGroup
from dataplane.wire.prometheus_text import CONTENT_TYPE, family_header, label_value


def control_plane_metrics() -> str:
    lines = family_header(
        "mu_benchmark_failure_streak", "gauge", "Consecutive failed benchmarks of a model profile."
    )
    for model, gpu_type, failures in ModelProfile.objects.values_list(
        "model", "gpu_type__name", "benchmark_failures"
    ).order_by("model", "gpu_type__name"):
        lines.append(
            f'mu_benchmark_failure_streak{{model="{label_value(model)}",gpu_type="{label_value(gpu_type)}"}}'
            f" {failures}"
        )
    lines += family_header("mu_oncall_open_groups", "gauge", "Unresolved on-call groups.")
    for row in (
        EventGroup.objects.unresolved()
        .values("kind", "severity")
        .annotate(n=Count("id"))
        .order_by("kind", "severity")
    ):
        lines.append(f'mu_oncall_open_groups{{kind="{row["kind"]}",severity="{row["severity"]}"}} {row["n"]}')
    return "\n".join(lines) + "\n"


class MetricsView(APIView):
    permission_classes = [permissions.IsAuthenticated, OperatorOnly]

    @extend_schema(responses={(200, "text/plain"): OpenApiResponse(OpenApiTypes.STR)})
    def get(self, request: Request) -> HttpResponse:
        """The control plane's Prometheus metrics (text format 0.0.4)."""
        return HttpResponse(control_plane_metrics(), content_type=CONTENT_TYPE)
