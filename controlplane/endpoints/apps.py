from django.apps import AppConfig


class EndpointsConfig(AppConfig):
    name = "controlplane.endpoints"
    label = "endpoints"

    def ready(self) -> None:
        from controlplane.endpoints.routing import withdraw_on_revoke
        from controlplane.tenants.models import key_revoked

        key_revoked.connect(withdraw_on_revoke, dispatch_uid="endpoints.withdraw_on_revoke")
