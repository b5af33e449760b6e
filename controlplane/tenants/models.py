"""Tenants, API keys and principals.

An API key belongs to one tenant, or is an operator key (platform staff, sees every tenant).
The secret is shown once when the key is made; only its SHA-256 is stored. Keys carry 256 bits
of randomness, so a fast hash is enough (a slow KDF guards low-entropy passwords, not these).
"""

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Self, TypeVar

from django.conf import settings
from django.contrib.auth.models import User
from django.core.validators import RegexValidator
from django.db import models, transaction
from django.dispatch import Signal
from django.utils import timezone

KEY_PREFIX = "mu_"

# Sent by ApiKey.revoke once the key's row says so (key=the ApiKey), in the revoker's transaction:
# the endpoints app withdraws the published routing table on it (EndpointsConfig.ready), so that
# routers refuse the key within a poll, however large the table.
key_revoked = Signal()

# DNS-label shaped names: they become Kubernetes object names and URL parts later.
slug_validator = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
    "use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit",
)


@dataclass(frozen=True)
class Principal:
    """Who is making a request: an operator, or a member of one tenant."""

    tenant: "Tenant | None"  # None for operators
    is_operator: bool
    name: str  # the key's or the user's name, for audit trails
    api_key_id: int | None = None

    is_authenticated = True  # DRF's IsAuthenticated reads this

    @property
    def tenant_id(self) -> int | None:
        return self.tenant.pk if self.tenant else None


@dataclass(frozen=True)
class PodPrincipal(Principal):
    """A pod with its endpoint's events credential (controlplane.endpoints.pod_keys): it may post
    that endpoint's events and nothing else. Not authenticated as far as every other view's
    IsAuthenticated is concerned; only the events create admits it (OwnPodEvents)."""

    endpoint_id: int = 0

    is_authenticated = False


def tenant_xor_operator(name: str) -> models.CheckConstraint:
    """A key or a user belongs to exactly one tenant, or is an operator's and to none."""
    return models.CheckConstraint(
        name=name,
        condition=(
            models.Q(is_operator=True, tenant__isnull=True)
            | models.Q(is_operator=False, tenant__isnull=False)
        ),
    )


_M = TypeVar("_M", bound=models.Model)


class TenantScopedQuerySet(models.QuerySet[_M]):
    """The one place tenant scoping is decided. Subclasses name the path to the tenant."""

    tenant_field = "tenant"

    def visible_to(self, principal: Principal) -> Self:
        if principal.is_operator:
            return self
        if principal.tenant is None:
            return self.none()
        return self.filter(**{self.tenant_field: principal.tenant_id})


class TenantQuerySet(TenantScopedQuerySet["Tenant"]):
    tenant_field = "pk"


class Tenant(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    display_name = models.CharField(max_length=200, blank=True)
    # Operator-set bound on the GPUs of the tenant's endpoints' minimum replicas, and of their
    # maximum replicas, each summed over its endpoints (controlplane.selling); null: the
    # TENANT_GPU_QUOTA_DEFAULT setting.
    gpu_quota = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ApiKeyQuerySet(TenantScopedQuerySet["ApiKey"]):
    def active(self) -> "ApiKeyQuerySet":
        return self.filter(revoked_at__isnull=True)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiKey(models.Model):
    name = models.CharField(max_length=100)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="api_keys"
    )
    is_operator = models.BooleanField(default=False)
    # First characters of the secret, shown in lists so people can tell keys apart.
    prefix = models.CharField(max_length=12)
    secret_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [tenant_xor_operator("api_key_tenant_xor_operator")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}...)"

    @classmethod
    def issue(cls, *, name: str, tenant: Tenant | None) -> tuple["ApiKey", str]:
        """Make a key; returns it with its secret, which is never stored nor shown again. A
        tenant's key within its bounds only (``key_limits``: KeyLimitReached otherwise); the
        tenant's row is locked while they are counted, so concurrent makers queue on it and
        the 101st of 101 at once is refused like the 101st in turn."""
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        with transaction.atomic():
            if tenant is not None:
                cls._check_bounds(tenant)
            key = cls.objects.create(
                name=name,
                tenant=tenant,
                is_operator=tenant is None,
                prefix=secret[: len(KEY_PREFIX) + 6],
                secret_hash=hash_secret(secret),
            )
        return key, secret

    @classmethod
    def _check_bounds(cls, tenant: Tenant) -> None:
        from controlplane.tenants.key_limits import CREATION_WINDOW_S, refusal

        Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).values_list("pk").first()
        now = timezone.now()
        keys = cls.objects.filter(tenant=tenant)
        recent = keys.filter(created_at__gt=now - timedelta(seconds=CREATION_WINDOW_S))
        made = recent.aggregate(n=models.Count("id"), oldest=models.Min("created_at"))
        refused = refusal(
            tenant.name,
            active=keys.active().count(),
            made_in_window=made["n"],
            oldest_in_window_age_s=(now - made["oldest"]).total_seconds() if made["oldest"] else 0.0,
            cap=settings.API_KEYS_PER_TENANT_MAX,
            per_hour=settings.API_KEY_CREATIONS_PER_HOUR,
        )
        if refused is not None:
            raise refused

    @classmethod
    def authenticate(cls, secret: str) -> "ApiKey | None":
        """The active key with this secret, its last-used time refreshed; None if unknown."""
        key = cls.objects.active().select_related("tenant").filter(secret_hash=hash_secret(secret)).first()
        if key is None:
            return None
        now = timezone.now()
        stale_before = now - timedelta(seconds=settings.API_KEY_LAST_USED_RESOLUTION_S)
        if key.last_used_at is None or key.last_used_at < stale_before:
            # One request writes it; the others at that moment skip it rather than wait: the row
            # lock lasts the request's transaction (a sale holds it while it waits for its pool),
            # and twenty sellers on one key queued there one behind another for seconds.
            with transaction.atomic():
                row = (
                    cls.objects.select_for_update(skip_locked=True)
                    .filter(pk=key.pk)
                    .values_list("pk", "last_used_at")
                    .first()
                )
                if row is not None and (row[1] is None or row[1] < stale_before):
                    cls.objects.filter(pk=key.pk).update(last_used_at=now)
            key.last_used_at = now
        return key

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])
            key_revoked.send(sender=ApiKey, key=self)  # routers refuse it within a poll

    @property
    def principal(self) -> Principal:
        return Principal(tenant=self.tenant, is_operator=self.is_operator, name=self.name, api_key_id=self.pk)


class Member(models.Model):
    """A console user: a member of one tenant, or an operator."""

    user = models.OneToOneField(User, on_delete=models.CASCADE, related_name="member")
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="members"
    )
    is_operator = models.BooleanField(default=False)

    class Meta:
        constraints = [tenant_xor_operator("member_tenant_xor_operator")]

    def __str__(self) -> str:
        return f"{self.user.username} ({'operator' if self.is_operator else self.tenant})"

    @property
    def principal(self) -> Principal:
        return Principal(tenant=self.tenant, is_operator=self.is_operator, name=self.user.username)
