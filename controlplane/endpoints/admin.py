"""Endpoints in Django's admin, shown and never written: an endpoint's writes are checked against
its pool, its tenant's quota and its rollout under their locks, and its delete closes its
billing (controlplane.selling, controlplane.api), which an admin form would pass by."""

from django.contrib import admin

from controlplane.capacity.admin import ShownNotWritten
from controlplane.endpoints.models import Endpoint


@admin.register(Endpoint)
class EndpointAdmin(ShownNotWritten):
    list_display = ["name", "tenant", "profile", "pool", "state", "desired_replicas", "ready_replicas"]
    list_select_related = ["tenant", "profile__gpu_type", "pool"]
