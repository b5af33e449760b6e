"""Viewsets. Scoping, permissions and error mapping come from the bases; views stay short."""

from typing import Any, NamedTuple, TypeVar, cast

from django.db.models import Model, QuerySet
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, permissions, status, viewsets
from rest_framework import serializers as drf_serializers
from rest_framework.decorators import action, api_view
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity.ledger import PoolLedger
from controlplane import drivers, pods, pool_ledgers, rollouts, selling
from controlplane.api import filters, params, serializers
from controlplane.api.auth import request_principal
from controlplane.api.pagination import EventCursorPagination, KeysetPagination, ReservationPagination
from controlplane.api.permissions import MayAcknowledge, OperatorOnly, OperatorWrites, OwnPodEvents
from controlplane.api.schema import ApiErrorSerializer
from controlplane.api.serializers.endpoints import COLUMNS as ENDPOINT_COLUMNS
from controlplane.capacity.models import (
    GpuPool,
    GpuType,
    ModelProfile,
    ProvisionedAllowance,
    Reservation,
    StoredLedger,
)
from controlplane.endpoints import routing, samples
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.endpoints.routing import routing_table
from controlplane.oncall.models import Event
from controlplane.tenants.models import ApiKey, Tenant, TenantScopedQuerySet
from dataplane.wire import load_samples
from dataplane.wire.load_samples import RouterSecond, SampleError

AUTHENTICATED = permissions.IsAuthenticated

_M = TypeVar("_M", bound=Model)


def visible(queryset: QuerySet[_M], request: Request) -> QuerySet[_M]:
    """What the principal may see of a scoped viewset's queryset (always a TenantScopedQuerySet)."""
    return cast(TenantScopedQuerySet[_M], queryset).visible_to(request_principal(request))


class RolloutCommand(serializers.StrictInput, drf_serializers.Serializer[Any]):
    action = drf_serializers.ChoiceField(choices=["promote", "abort"])


class RouterSecondDoc(drf_serializers.Serializer[Any]):
    """The body's shape, for the schema; dataplane.wire.load_samples checks it (and every row)."""

    router = drf_serializers.RegexField(
        load_samples.ROUTER_ID.pattern, help_text="The posting router's id: with second, the idempotency key"
    )
    second = drf_serializers.IntegerField(min_value=1, max_value=load_samples.MAX_SECOND)
    rows = drf_serializers.ListField(child=drf_serializers.DictField(), help_text="Traffic or queue rows")


class ScopedViewSet(viewsets.ModelViewSet[_M]):
    """Lists and looks up only what the principal may see: another tenant's object is a 404."""

    def get_queryset(self) -> QuerySet[_M]:
        return visible(super().get_queryset(), self.request)


class TenantViewSet(ScopedViewSet[Tenant]):
    queryset = Tenant.objects.all()
    serializer_class = serializers.TenantSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_fields = ["name"]


class ApiKeyViewSet(mixins.CreateModelMixin, mixins.DestroyModelMixin, viewsets.ReadOnlyModelViewSet[ApiKey]):
    """Keys: the secret appears once, in the create response. DELETE revokes (the row stays)."""

    queryset = ApiKey.objects.select_related("tenant")
    serializer_class = serializers.ApiKeySerializer
    permission_classes = [AUTHENTICATED]

    def get_queryset(self) -> QuerySet[ApiKey]:
        return visible(super().get_queryset(), self.request)

    @extend_schema(
        responses={
            201: serializers.ApiKeySerializer,
            409: ApiErrorSerializer,
            429: ApiErrorSerializer,
        }
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Make a key; its secret is in this response only. A tenant's key is refused past its
        bounds: 409 `api_key_limit` at API_KEYS_PER_TENANT_MAX active keys (revoke one to make
        room), 429 `api_key_rate` with Retry-After past API_KEY_CREATIONS_PER_HOUR."""
        return super().create(request, *args, **kwargs)

    def perform_destroy(self, instance: ApiKey) -> None:
        instance.revoke()


class GpuTypeViewSet(viewsets.ModelViewSet[GpuType]):
    queryset = GpuType.objects.all()
    serializer_class = serializers.GpuTypeSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_fields = ["name"]


class GpuPoolViewSet(viewsets.ModelViewSet[GpuPool]):
    queryset = GpuPool.objects.select_related("gpu_type")
    serializer_class = serializers.GpuPoolSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_class = filters.GpuPoolFilterSet


class ModelProfileViewSet(viewsets.ModelViewSet[ModelProfile]):
    queryset = ModelProfile.objects.select_related("gpu_type")
    serializer_class = serializers.ModelProfileSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_class = filters.ModelProfileFilterSet

    @extend_schema(responses=serializers.ProfileFitSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def fits(self, request: Request, pk: str | None = None) -> Response:
        """Every benchmark of this profile, newest first: published, refused and failed."""
        fits = self.get_object().fits.order_by("-id")[:100]
        return Response(serializers.ProfileFitSerializer(fits, many=True).data)

    @extend_schema(request=None, responses={202: serializers.ModelProfileSerializer})
    @action(detail=True, methods=["post"])
    def benchmark(self, request: Request, pk: str | None = None) -> Response:
        """Ask for a new benchmark; the next beat tick (within a minute) runs it."""
        profile = self.get_object()
        ModelProfile.objects.filter(pk=profile.pk).update(
            benchmark_requested_at=timezone.now(), benchmark_retry_at=None
        )
        profile.refresh_from_db()
        return Response(self.get_serializer(profile).data, status=status.HTTP_202_ACCEPTED)


class EndpointPages(KeysetPagination):
    """A page of endpoints as the plain rows their answers read (serializers.endpoints.COLUMNS)."""

    columns = tuple(ENDPOINT_COLUMNS.values())


class EndpointViewSet(ScopedViewSet[Endpoint]):
    queryset = Endpoint.objects.with_related()
    serializer_class = serializers.EndpointSerializer
    permission_classes = [AUTHENTICATED]
    filterset_class = filters.EndpointFilterSet
    pagination_class = EndpointPages

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "release", bool, description="Operators: release the endpoint's reservation, then delete"
            )
        ],
        responses={204: None, 409: dict},
    )
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Delete; an endpoint with a reservation is a 409 `protected` naming it, unless an operator
        passes ?release=true (the sale ends, with its event, then the endpoint goes)."""
        endpoint = self.get_object()
        principal = request_principal(request)
        raw = request.query_params.get("release")
        try:
            release = raw is not None and params.boolean("release", raw)
        except params.ParameterError as exc:
            raise ValidationError({"release": [exc.message]}) from None
        if release and not principal.is_operator:
            raise PermissionDenied("only operators may release a reservation (?release=true)")
        selling.delete_endpoint(endpoint, release_by=principal.name if release else None)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=None, responses={200: dict, 202: dict, 409: ApiErrorSerializer, 503: ApiErrorSerializer}
    )
    @action(detail=True, methods=["post"])
    def wake(self, request: Request, pk: str | None = None) -> Response:
        """Scale from zero now: routers call this while they hold a request for the endpoint.
        202 when a replica was asked for, 200 when it already has replicas; 409 when it cannot scale
        to zero or no cluster driver is configured, 503 when the cluster cannot act now."""
        endpoint = self.get_object()
        if not endpoint.scale_to_zero_enabled and endpoint.desired_replicas == 0:
            return Response(
                {"error": "not_scale_to_zero", "detail": f"{endpoint.name} does not scale to zero"},
                status=status.HTTP_409_CONFLICT,
            )
        cluster = drivers.driver()
        if cluster is None:  # a configuration, not an outage: nothing to retry, so no 503
            return Response(
                {
                    "error": "no_cluster_driver",
                    "detail": "no cluster driver is configured (CLUSTER_DRIVER=none): nothing here can start"
                    " a pod; pods are registered through /api/v1/pods/",
                },
                status=status.HTTP_409_CONFLICT,
            )
        woke = pods.wake(endpoint, cluster, timezone.now())
        endpoint.refresh_from_db()
        body = {"desired_replicas": endpoint.desired_replicas, "ready_replicas": endpoint.ready_replicas}
        return Response(body, status=status.HTTP_202_ACCEPTED if woke else status.HTTP_200_OK)

    @extend_schema(
        request=RolloutCommand, responses={202: dict, 404: ApiErrorSerializer, 409: ApiErrorSerializer}
    )
    @action(detail=True, methods=["post"])
    def rollout(self, request: Request, pk: str | None = None) -> Response:
        """Promote the canary of the rollout in progress, or abort it (back to the old version);
        the next autoscaler pass acts on it. A promote starts the rest of the new version's
        replicas beside the old one's share: a 409 `oversold` or `over_quota` when they do not fit."""
        endpoint = self.get_object()
        command = RolloutCommand(data=request.data)
        command.is_valid(raise_exception=True)
        try:
            r = rollouts.command(endpoint, command.validated_data["action"])
        except Rollout.DoesNotExist:
            raise NotFound(f"{endpoint.name} has no rollout in progress") from None
        return Response(
            {"rollout": r.pk, "action": command.validated_data["action"], "phase": r.phase},
            status=status.HTTP_202_ACCEPTED,
        )


class PodViewSet(ScopedViewSet[Pod]):
    """Pods as the cluster driver reports them; tenants read their endpoints' pods."""

    queryset = Pod.objects.select_related("endpoint")
    serializer_class = serializers.PodSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_class = filters.PodFilterSet
    pagination_class = KeysetPagination


class RoutingTableView(APIView):
    """What the routers need, with an ETag: `If-None-Match` answers 304 while nothing changed."""

    permission_classes = [AUTHENTICATED, OperatorOnly]

    @extend_schema(responses={200: dict, 304: None})
    def get(self, request: Request) -> Response | HttpResponse:
        copy = routing.published_copy()  # with Redis: the table built in the last seconds
        table, version = (None, copy[0]) if copy else (t := routing_table(), t.version)
        etag = f'"{version}"'
        if request.headers.get("If-None-Match") == etag:
            return Response(status=status.HTTP_304_NOT_MODIFIED, headers={"ETag": etag})
        body = None if copy is None else copy[1]()
        if body is None:  # no copy, or its body gone: the table as built now
            table = table or routing_table()
            return Response(table.to_json(), headers={"ETag": f'"{table.version}"'})
        return HttpResponse(body, content_type="application/json", headers={"ETag": etag})


class RoutingKeyView(APIView):
    """One tenant key by the SHA-256 of its secret, for a router that has not seen it: 200 with
    its tenant and the tenant's keys' epoch while it is active
    (dataplane.wire.routing_table.KeyLookup), 404 otherwise."""

    permission_classes = [AUTHENTICATED, OperatorOnly]

    @extend_schema(responses={200: dict})
    def get(self, request: Request, digest: str) -> Response:
        try:
            found = routing.key_lookup(digest)
        except ValueError as exc:
            raise ValidationError({"digest": [str(exc)]}) from None
        if found.tenant is None:
            raise NotFound("no active tenant API key has this digest")
        return Response(found.to_json())


class LoadSamplesView(APIView):
    """A router's second of per-endpoint rows, when there is no Redis (the embedded default):
    201 when stored, 200 when that router's second was stored before (a retry), adding nothing."""

    permission_classes = [AUTHENTICATED, OperatorOnly]

    @extend_schema(request=RouterSecondDoc, responses={201: dict, 200: dict})
    def post(self, request: Request) -> Response:
        now = timezone.now()
        try:
            posted = RouterSecond.from_json(request.data)
            load_samples.check_not_ahead(posted.second, now.timestamp())
        except SampleError as exc:
            raise ValidationError({exc.field: str(exc)} if exc.field else str(exc)) from None
        stored = samples.DatabaseSeconds.store(posted, now)
        if stored is None:
            return Response({"stored": 0, "duplicate": True}, status=status.HTTP_200_OK)
        return Response({"stored": stored}, status=status.HTTP_201_CREATED)


class ReservationViewSet(ScopedViewSet[Reservation]):
    """Sold capacity. Operators sell (POST), change (PATCH) and release (DELETE); tenants read."""

    queryset = Reservation.objects.select_related("endpoint__tenant", "endpoint__profile", "endpoint__pool")
    serializer_class = serializers.ReservationSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_class = filters.ReservationFilterSet
    pagination_class = ReservationPagination

    def perform_destroy(self, instance: Reservation) -> None:
        selling.release(instance, released_by=request_principal(self.request).name)


class ProvisionedAllowanceViewSet(ScopedViewSet[ProvisionedAllowance]):
    """Each tenant's allowance per pool for minimum replicas beyond its reservations. Operators
    set (POST, PATCH) and remove (DELETE: back to the default) them; tenants read their own."""

    queryset = ProvisionedAllowance.objects.select_related("tenant", "pool")
    serializer_class = serializers.ProvisionedAllowanceSerializer
    permission_classes = [AUTHENTICATED, OperatorWrites]
    filterset_class = filters.ProvisionedAllowanceFilterSet


class EventViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet[Event]):
    """Events, newest first, with a cursor. Operators write them, and pods their own endpoint's
    (with its events credential: controlplane.endpoints.pod_keys)."""

    queryset = Event.objects.select_related("tenant")
    serializer_class = serializers.EventSerializer
    permission_classes = [(AUTHENTICATED & OperatorWrites) | OwnPodEvents]
    filterset_class = filters.EventFilterSet
    pagination_class = EventCursorPagination

    def get_queryset(self) -> QuerySet[Event]:
        return visible(super().get_queryset(), self.request)

    @extend_schema(request=None, responses=serializers.EventSerializer)
    @action(detail=True, methods=["post"], permission_classes=[AUTHENTICATED, MayAcknowledge])
    def acknowledge(self, request: Request, pk: str | None = None) -> Response:
        """Operators acknowledge events (oncall.models.may_acknowledge); the first acknowledgement stands."""
        event = self.get_object()
        event.acknowledge(request_principal(request).name, timezone.now())
        return Response(self.get_serializer(event).data)


class PoolCapacity(NamedTuple):
    pool: GpuPool
    ledger: PoolLedger
    stored: StoredLedger  # its version and when it was computed


NODES = OpenApiParameter(
    "nodes",
    bool,
    description="Also which replica occupies what, node by node (the pool's endpoints read and"
    " packed for this answer; without it the stored figures alone are read)",
)


class CapacityViewSet(viewsets.ViewSet):
    """Per pool: what we HAVE, SOLD and USE, in GPUs and in MU/min, as its last write stored
    it (controlplane.pool_ledgers.refresh_ledgers). Operators only."""

    permission_classes = [AUTHENTICATED, OperatorOnly]
    lookup_value_regex = r"\d+"

    def _pools(self) -> QuerySet[GpuPool]:
        pools = GpuPool.objects.select_related("gpu_type")
        gpu_type = self.request.query_params.get("gpu_type")
        return pools.filter(gpu_type__name=gpu_type) if gpu_type else pools

    def _rows(self, pools: list[GpuPool]) -> Response:
        raw = self.request.query_params.get("nodes")
        try:
            nodes = raw is not None and params.boolean("nodes", raw)
        except params.ParameterError as exc:
            raise ValidationError({"nodes": [exc.message]}) from None
        stored = pool_ledgers.stored_ledgers(pools)
        live = pool_ledgers.pool_ledgers(pools) if nodes else {}
        rows = [PoolCapacity(p, live.get(p.pk) or stored[p.pk].ledger(), stored[p.pk]) for p in pools]
        serializer = serializers.PoolNodesSerializer if nodes else serializers.PoolCapacitySerializer
        return Response(serializer(rows, many=True).data)

    # The schema's answer is the figures' (PoolCapacitySerializer): `nodes` comes only when asked
    # (NODES), one property more (PoolNodesSerializer), which the schema allows.
    @extend_schema(
        responses=serializers.PoolCapacitySerializer(many=True),
        parameters=[OpenApiParameter("gpu_type", str, description="Only pools of this GPU type"), NODES],
    )
    def list(self, request: Request) -> Response:
        return self._rows(list(self._pools()))

    @extend_schema(
        responses=serializers.PoolCapacitySerializer,
        parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH), NODES],
    )
    def retrieve(self, request: Request, pk: str) -> Response:
        response = self._rows([self._pools().get(pk=pk)])
        response.data = response.data[0]
        return response


@extend_schema(responses={200: dict})
@api_view(["GET"])
def whoami(request: Request) -> Response:
    principal = request_principal(request)
    return Response(
        {
            "name": principal.name,
            "operator": principal.is_operator,
            "tenant": principal.tenant.name if principal.tenant else None,
        },
        status=status.HTTP_200_OK,
    )
