from django.contrib import admin

from controlplane.endpoints.models import Endpoint


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "profile", "pool", "state", "desired_replicas", "ready_replicas"]
    list_select_related = ["tenant", "profile__gpu_type", "pool"]
