from django.contrib import admin

from controlplane.tenants.models import ApiKey, Tenant


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "is_operator", "prefix", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "secret_hash", "last_used_at"]


admin.site.register(Tenant)
