from django.contrib import admin

from controlplane.oncall.models import Event


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["id", "time", "severity", "kind", "tenant", "endpoint_name", "pod", "message"]
    list_filter = ["severity", "kind"]
