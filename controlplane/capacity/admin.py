"""The capacity models in Django's admin (served only with ADMIN_ENABLED). A reservation is shown,
never written there: a sale is checked against its pool and stored in its pool's ledger under
the pool's lock (controlplane.selling), which an admin form would pass by."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from controlplane.capacity.models import GpuPool, GpuType, ModelProfile, Reservation

admin.site.register([GpuType, GpuPool, ModelProfile])


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
