from django.apps import AppConfig


class OncallConfig(AppConfig):
    name = "controlplane.oncall"
    label = "oncall"
