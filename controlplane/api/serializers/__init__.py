"""Serializers: names in, names out (GPU types, pools, tenants by name; endpoints by id). One
module per job: base (what they all share), tenants, capacity, endpoints, events and ledgers;
every one is importable from here, as `controlplane.api.serializers.X`."""

from controlplane.api.serializers.base import (
    ExactNumberField,
    FastAnswer,
    StrictInput,
    VisibleTenantField,
    principal_of,
    refused_fields,
)
from controlplane.api.serializers.capacity import (
    MAX_GPUS_PER_NODE,
    MAX_NODES_PER_POOL,
    GpuPoolSerializer,
    GpuTypeSerializer,
    ModelProfileSerializer,
    ProfileFitSerializer,
    ProvisionedAllowanceSerializer,
    ReservationSerializer,
)
from controlplane.api.serializers.endpoints import EndpointSerializer, PodSerializer
from controlplane.api.serializers.events import EventSerializer, redact_detail
from controlplane.api.serializers.ledgers import (
    ModelCapacitySerializer,
    NodeUseSerializer,
    PlacedReplicaSerializer,
    PoolCapacitySerializer,
    PoolNodesSerializer,
)
from controlplane.api.serializers.tenants import ApiKeySerializer, TenantSerializer

__all__ = [
    "MAX_GPUS_PER_NODE",
    "MAX_NODES_PER_POOL",
    "ApiKeySerializer",
    "EndpointSerializer",
    "EventSerializer",
    "ExactNumberField",
    "FastAnswer",
    "GpuPoolSerializer",
    "GpuTypeSerializer",
    "ModelCapacitySerializer",
    "ModelProfileSerializer",
    "NodeUseSerializer",
    "PlacedReplicaSerializer",
    "PodSerializer",
    "PoolCapacitySerializer",
    "PoolNodesSerializer",
    "ProfileFitSerializer",
    "ProvisionedAllowanceSerializer",
    "ReservationSerializer",
    "StrictInput",
    "TenantSerializer",
    "VisibleTenantField",
    "principal_of",
    "redact_detail",
    "refused_fields",
]
