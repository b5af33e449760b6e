from django.apps import AppConfig


class CapacityConfig(AppConfig):
    name = "controlplane.capacity"
    label = "capacity"
    verbose_name = "Capacity"
