from django.apps import AppConfig


class CapacityConfig(AppConfig):
    name = "capacity"
    label = "capacity"
    verbose_name = "Capacity"
