"""The capacity models in Django's admin (served only with ADMIN_ENABLED). Pools, model profiles
and reservations are shown, never written there: their writes are checked under the pool's lock
(controlplane.selling: a pool shrunk or a model re-priced below what is sold in it is refused, a
sale is stored in its pool's ledger), which an admin form would pass by. The REST API and the
console write them."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from controlplane.capacity.models import GpuPool, GpuType, ModelProfile, Reservation

admin.site.register(GpuType)


class ShownNotWritten(admin.ModelAdmin):
    """An admin that lists and shows rows, and adds, changes and deletes none."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


admin.site.register([GpuPool, ModelProfile, Reservation], ShownNotWritten)
