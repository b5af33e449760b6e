"""Tenants and their API keys (a key's secret shown once, in the answer that makes it)."""

import functools
from typing import Any

from rest_framework import serializers

from controlplane import tenant_limits
from controlplane.api.serializers.base import FastAnswer, StrictInput, VisibleTenantField, principal_of
from controlplane.tenants.models import ApiKey, Tenant


class TenantSerializer(FastAnswer, StrictInput, serializers.ModelSerializer[Tenant]):
    class Meta:
        model = Tenant
        fields = ["id", "name", "display_name", "gpu_quota", "effective_gpu_quota", "created_at"]
        read_only_fields = ["created_at"]
        extra_kwargs = {
            "gpu_quota": {
                "help_text": "GPUs its endpoints may take at their minimum replicas, and at their"
                " maximum, each summed (both versions of a rollout); null: the default, the fleet's"
                " GPUs (at most TENANT_GPU_QUOTA_DEFAULT when set). Operators set it."
            }
        }

    effective_gpu_quota = serializers.SerializerMethodField()

    def get_effective_gpu_quota(self, tenant: Tenant) -> int:
        return tenant.gpu_quota if tenant.gpu_quota is not None else self._default_gpu_quota

    @functools.cached_property
    def _default_gpu_quota(self) -> int:
        """tenant_limits.default_gpu_quota, read once per list (a list's rows share this serializer)."""
        return tenant_limits.default_gpu_quota()


class ApiKeySerializer(FastAnswer, StrictInput, serializers.ModelSerializer[ApiKey]):
    tenant = VisibleTenantField(
        slug_field="name", queryset=Tenant.objects.all(), required=False, allow_null=True
    )

    class Meta:
        model = ApiKey
        fields = ["id", "name", "tenant", "is_operator", "prefix", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["is_operator", "prefix", "created_at", "last_used_at", "revoked_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        principal = principal_of(self)
        if not principal.is_operator:
            if attrs.get("tenant") not in (None, principal.tenant):
                raise serializers.ValidationError({"tenant": "you can only make keys for your own tenant"})
            attrs["tenant"] = principal.tenant
        return attrs

    def create(self, validated_data: dict[str, Any]) -> ApiKey:
        key, secret = ApiKey.issue(name=validated_data["name"], tenant=validated_data.get("tenant"))
        # Shown once, in this response only: an attribute of this instance, never a model field.
        key.secret = secret  # type: ignore[attr-defined]
        return key

    def to_representation(self, instance: ApiKey) -> dict[str, Any]:
        data = super().to_representation(instance)
        if secret := getattr(instance, "secret", None):
            data["key"] = secret
        return data
