"""The rules of creating or changing an endpoint, whoever asks (the API's serializer; the console's
form through it): who owns it (a tenant's key its own tenant, an operator names one, an endpoint
never changes tenant), the model profile its model and GPU type name, its pool (named, else placed
by selling.place, in its preferred region: again when a new GPU type or region moves it away),
min <= max provisioned concurrency, and a name its tenant does not use yet. `settle` takes the
fields asked by their API names and answers what to save, or raises EndpointRefused naming each
refused field and why (selling.place's NoPlacement passes through; placement runs only when no
other rule refuses); `refusals` answers the same rules' errors for a request whose other fields
did not parse, so each error is reported at once. Capacity, quota and the move itself are checked
as the endpoint saves (selling.save_endpoint)."""

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from capacity.provisioning import bounds_error, replica_bounds
from controlplane import selling
from controlplane.capacity.models import GpuPool, GpuType, ModelProfile
from controlplane.endpoints.models import Endpoint
from controlplane.tenants.models import Principal, Tenant


class EndpointRefused(Exception):
    """A create or change the rules refuse: `errors` maps each field (its API name) to why."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{field}: {why}" for field, why in errors.items()))


@dataclass(frozen=True)
class Settled:
    """What a create or change saves: its tenant, its profile, and the pool named or placed
    (`pool`; None when the endpoint stays in its pool)."""

    tenant: Tenant
    profile: ModelProfile
    pool: GpuPool | None


def settle(principal: Principal, endpoint: Endpoint | None, asked: Mapping[str, Any]) -> Settled:
    """Check a create (`endpoint` None) or a change of `endpoint` asked by `principal`. `asked`
    holds the fields the request sets, by their API names (`model` and `gpu_type` by name, `tenant`
    and `pool` as instances); the others keep the endpoint's values (a create's defaults)."""
    errors: dict[str, str] = {}
    tenant, gpu_type, profile, pool = _check(principal, endpoint, asked, frozenset(), errors)
    # Placement runs last, for a request nothing else refuses: its NoPlacement would otherwise
    # hide the other fields' errors, and a request that is not saved needs no pool.
    if not errors and pool is None and gpu_type is not None and profile is not None:
        pool = _placed(endpoint, profile, gpu_type, asked, errors)
    if errors:
        raise EndpointRefused(errors)
    assert tenant is not None and profile is not None  # else refused above
    return Settled(tenant, profile, pool)


def refusals(
    principal: Principal, endpoint: Endpoint | None, asked: Mapping[str, Any], invalid: set[str]
) -> dict[str, str]:
    """What the rules refuse in a request some of whose fields did not parse (`invalid`, by API
    name; `asked` holds the others): every rule whose fields all parsed, so a form shows all its
    errors at once (a bad name beside min > max), not one after another as each is fixed."""
    errors: dict[str, str] = {}
    _check(principal, endpoint, asked, invalid, errors)
    return errors


def _check(
    principal: Principal,
    endpoint: Endpoint | None,
    asked: Mapping[str, Any],
    invalid: Set[str],
    errors: dict[str, str],
) -> tuple[Tenant | None, GpuType | None, ModelProfile | None, GpuPool | None]:
    """Every rule but placement, each skipped when a field it reads is `invalid`; what is wrong
    goes into `errors` by field. Answers the tenant, GPU type, profile and named pool."""
    tenant = None if "tenant" in invalid else _owner(principal, endpoint, asked.get("tenant"), errors)
    gpu_type, profile, pool = None, None, None
    if "gpu_type" not in invalid:
        gpu_name = asked.get("gpu_type", endpoint.profile.gpu_type.name if endpoint else None)
        gpu_type = GpuType.objects.filter(name=gpu_name).first()
        if gpu_type is None:
            known = ", ".join(GpuType.objects.values_list("name", flat=True)) or "none"
            errors["gpu_type"] = f"unknown GPU type {gpu_name!r} (known: {known})"
    if gpu_type is not None and "model" not in invalid:
        model = asked.get("model", endpoint.profile.model if endpoint else None)
        profile = ModelProfile.objects.filter(model=model, gpu_type=gpu_type).first()
        if profile is None:
            known = ", ".join(gpu_type.profiles.values_list("model", flat=True)) or "none"
            errors["model"] = f"no model profile for {model!r} on {gpu_type.name} (profiled there: {known})"
    if gpu_type is not None and not invalid & {"pool", "region_preference"}:
        pool = _named_pool(endpoint, gpu_type, asked, errors)

    if not invalid & {"min_provisioned_concurrency", "max_provisioned_concurrency"}:
        low = asked.get("min_provisioned_concurrency", getattr(endpoint, "min_provisioned_concurrency", 0))
        high = asked.get("max_provisioned_concurrency", getattr(endpoint, "max_provisioned_concurrency", 1))
        bounds = bounds_error(low, high)
        if bounds:
            errors["min_provisioned_concurrency"] = bounds

    name = None if "name" in invalid else asked.get("name", getattr(endpoint, "name", None))
    if tenant is not None and name is not None:
        clash = Endpoint.objects.filter(tenant=tenant, name=name)
        if endpoint is not None:
            clash = clash.exclude(pk=endpoint.pk)
        if clash.exists():
            errors["name"] = f"tenant {tenant.name!r} already has an endpoint named {name!r}"
    return tenant, gpu_type, profile, pool


def _owner(
    principal: Principal, endpoint: Endpoint | None, tenant: Tenant | None, errors: dict[str, str]
) -> Tenant | None:
    """The endpoint's tenant: its own on a change, the principal's for a tenant's key, the one
    an operator names on a create."""
    if endpoint is not None:
        if tenant is not None and tenant != endpoint.tenant:
            errors["tenant"] = "an endpoint cannot move to another tenant"
        return endpoint.tenant
    if not principal.is_operator:
        if tenant is not None and tenant != principal.tenant:
            errors["tenant"] = "you can only create endpoints for your own tenant"
        return principal.tenant
    if tenant is None:
        errors["tenant"] = "operators must name the tenant that owns the endpoint"
    return tenant


def _named_pool(
    endpoint: Endpoint | None, gpu_type: GpuType, asked: Mapping[str, Any], errors: dict[str, str]
) -> GpuPool | None:
    """The pool the request names, checked against the GPU type and the preferred region."""
    pool: GpuPool | None = asked.get("pool")
    region = asked.get("region_preference", getattr(endpoint, "region_preference", ""))
    if pool is not None and pool.gpu_type_id != gpu_type.pk:
        errors["pool"] = f"pool {pool.name!r} holds {pool.gpu_type.name} GPUs, not {gpu_type.name}"
    elif pool is not None and region and pool.region != region:
        errors["pool"] = f"pool {pool.name!r} is in region {pool.region!r}, not the preferred {region!r}"
    return pool


def _placed(
    endpoint: Endpoint | None,
    profile: ModelProfile,
    gpu_type: GpuType,
    asked: Mapping[str, Any],
    errors: dict[str, str],
) -> GpuPool | None:
    """Where a new endpoint, or one a new GPU type or region moves away, goes when it names no
    pool (selling.place); None when it stays in its pool."""
    region = asked.get("region_preference", getattr(endpoint, "region_preference", ""))
    moved_away = endpoint is not None and (
        endpoint.pool.gpu_type_id != gpu_type.pk
        or (region and "region_preference" in asked and endpoint.pool.region != region)
    )
    if endpoint is not None and not moved_away:
        return None
    pool = selling.place(profile, region, min_replicas(endpoint, asked))
    if pool is None:
        errors["gpu_type"] = f"no GPU pool holds {gpu_type.name} GPUs"
    return pool


def min_replicas(endpoint: Endpoint | None, asked: Mapping[str, Any]) -> int:
    """The minimum replicas the endpoint will have: what its placement must fit."""

    def value(name: str, default: Any) -> Any:
        return asked.get(name, getattr(endpoint, name, default))

    low, high = value("min_provisioned_concurrency", 0), value("max_provisioned_concurrency", 1)
    if bounds_error(low, high):
        return 0  # reported with the bounds
    return replica_bounds(
        low,
        high,
        value("target_concurrency_per_replica", settings.DEFAULT_TARGET_CONCURRENCY),
        value("scale_to_zero_enabled", False),
    )[0]
