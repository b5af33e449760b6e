"""Viewsets. Scoping, permissions and error mapping come from the bases; views stay short."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import api_view
from rest_framework.response import Response

from capacity.models import GpuPool, GpuType, ModelProfile, Reservation, pool_ledgers
from controlplane.api import filters, serializers
from controlplane.api.errors import _num
from controlplane.api.pagination import EventCursorPagination
from controlplane.api.permissions import OperatorOnly, OperatorWrites
from controlplane.endpoints.models import Endpoint
from controlplane.oncall.models import Event
from controlplane.tenants.models import ApiKey, Tenant

AUTHENTICATED = permissions.IsAuthenticated


class ScopedViewSet(viewsets.ModelViewSet):
    """Lists and looks up only what the principal may see: another tenant's object is a 404."""

    def get_queryset(self):
        return super().get_queryset().visible_to(self.request.user)


class TenantViewSet(ScopedViewSet):
    queryset = Tenant.objects.all()
    serializer_class = serializers.TenantSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_fields = ["name"]


class ApiKeyViewSet(mixins.CreateModelMixin, mixins.DestroyModelMixin, viewsets.ReadOnlyModelViewSet):
    """Keys: the secret appears once, in the create response. DELETE revokes (the row stays)."""

    queryset = ApiKey.objects.select_related("tenant")
    serializer_class = serializers.ApiKeySerializer
    permission_classes = [AUTHENTICATED]

    def get_queryset(self):
        return super().get_queryset().visible_to(self.request.user)

    def perform_destroy(self, instance):
        instance.revoke()


class GpuTypeViewSet(viewsets.ModelViewSet):
    queryset = GpuType.objects.all()
    serializer_class = serializers.GpuTypeSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_fields = ["name"]


class GpuPoolViewSet(viewsets.ModelViewSet):
    queryset = GpuPool.objects.select_related("gpu_type")
    serializer_class = serializers.GpuPoolSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_class = filters.GpuPoolFilterSet


class ModelProfileViewSet(viewsets.ModelViewSet):
    queryset = ModelProfile.objects.select_related("gpu_type")
    serializer_class = serializers.ModelProfileSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_class = filters.ModelProfileFilterSet


class EndpointViewSet(ScopedViewSet):
    queryset = Endpoint.objects.with_related()
    serializer_class = serializers.EndpointSerializer
    permission_classes = [AUTHENTICATED]
    filterset_class = filters.EndpointFilterSet


class ReservationViewSet(ScopedViewSet):
    """Sold capacity. Operators sell (POST), change (PATCH) and release (DELETE); tenants read."""

    queryset = Reservation.objects.select_related("endpoint__tenant", "endpoint__profile", "endpoint__pool")
    serializer_class = serializers.ReservationSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_class = filters.ReservationFilterSet

    def perform_destroy(self, instance):
        endpoint = instance.endpoint
        instance.delete()
        Event.record(
            Event.Kind.RESERVATION,
            f"{self.request.user.name} released {instance.mu_per_minute} MU/min on {endpoint.name}",
            endpoint=endpoint,
            reported_by=self.request.user.name,
            detail={"mu_per_minute": 0, "previous_mu_per_minute": instance.mu_per_minute},
        )


class EventViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Events, newest first, with a cursor. Operators (and the probers' keys) write them."""

    queryset = Event.objects.select_related("tenant")
    serializer_class = serializers.EventSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_class = filters.EventFilterSet
    pagination_class = EventCursorPagination

    def get_queryset(self):
        return super().get_queryset().visible_to(self.request.user)


class CapacityViewSet(viewsets.ViewSet):
    """Per pool: what we HAVE, SOLD and USE, in GPUs and in MU/min. Operators only."""

    permission_classes = [AUTHENTICATED, OperatorOnly]

    def _pools(self):
        pools = GpuPool.objects.select_related("gpu_type")
        gpu_type = self.request.query_params.get("gpu_type")
        return pools.filter(gpu_type__name=gpu_type) if gpu_type else pools

    @extend_schema(responses={200: dict})
    def list(self, request):
        pools = list(self._pools())
        ledgers = pool_ledgers(pools)
        return Response([capacity_row(pool, ledgers[pool.pk]) for pool in pools])

    @extend_schema(responses={200: dict})
    def retrieve(self, request, pk=None):
        pool = self._pools().get(pk=pk)
        return Response(capacity_row(pool, pool_ledgers([pool])[pool.pk]))


def capacity_row(pool: GpuPool, ledger) -> dict:
    return {
        "id": pool.pk,
        "pool": pool.name,
        "gpu_type": pool.gpu_type.name,
        "region": pool.region,
        "cluster": pool.cluster,
        "overcommit": _num(ledger.overcommit),
        "have_gpus": ledger.have_gpus,
        "sellable_gpus": _num(ledger.sellable_gpus),
        "sold_gpus": _num(ledger.sold_gpus),
        "used_gpus": _num(ledger.used_gpus),
        "headroom_gpus": _num(ledger.headroom_gpus),
        "have_mu_per_minute": _num(ledger.have_mu_per_minute),
        "sellable_mu_per_minute": _num(ledger.sellable_mu_per_minute),
        "sold_mu_per_minute": _num(ledger.sold_mu_per_minute),
        "used_mu_per_minute": _num(ledger.used_mu_per_minute),
        "headroom_mu_per_minute": _num(ledger.headroom_mu_per_minute),
        "oversold": ledger.oversold,
        "models": [
            {
                "model": m.model,
                "gpus_per_replica": m.shape.gpus_per_replica,
                "mu_per_replica_minute": m.shape.mu_per_replica_minute,
                "have_mu_per_minute": _num(m.have_mu_per_minute),
                "headroom_mu_per_minute": _num(m.headroom_mu_per_minute),
            }
            for m in ledger.models
        ],
    }


@extend_schema(responses={200: dict})
@api_view(["GET"])
def whoami(request):
    principal = request.user
    return Response(
        {
            "name": principal.name,
            "operator": principal.is_operator,
            "tenant": principal.tenant.name if principal.tenant else None,
        },
        status=status.HTTP_200_OK,
    )
