from django.apps import AppConfig


class EndpointsConfig(AppConfig):
    name = "controlplane.endpoints"
    label = "endpoints"
