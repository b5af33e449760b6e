"""`Authorization: Bearer <api key>` -> a Principal (tenant member or operator); a pod's events
credential (`mupod_...`, controlplane.endpoints.pod_keys) -> a PodPrincipal, which only the events
create admits."""

from typing import TYPE_CHECKING, Any, cast

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from controlplane.endpoints import pod_keys
from controlplane.endpoints.models import Endpoint
from controlplane.tenants.models import ApiKey, PodPrincipal, Principal

if TYPE_CHECKING:  # drf_spectacular.openapi loads DRF's settings, which import this module
    from drf_spectacular.openapi import AutoSchema


class BearerKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Principal, ApiKey | None] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None  # DRF answers 401 with the WWW-Authenticate below
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <api key>'")
        if pod_keys.is_events_key(secret.strip()):
            return pod_principal(secret.strip()), None
        key = ApiKey.authenticate(secret.strip())
        if key is None:
            raise exceptions.AuthenticationFailed("API key is unknown or revoked")
        return key.principal, key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def pod_principal(secret: str) -> PodPrincipal:
    endpoint_id = pod_keys.endpoint_of(secret)
    endpoint = (
        Endpoint.objects.select_related("tenant").filter(pk=endpoint_id).first() if endpoint_id else None
    )
    if endpoint is None:
        raise exceptions.AuthenticationFailed("events credential is unknown")
    return PodPrincipal(endpoint.tenant, False, f"pods of endpoint {endpoint.pk}", endpoint_id=endpoint.pk)


class BearerKeyScheme(OpenApiAuthenticationExtension):
    target_class = BearerKeyAuthentication
    name = "bearerKey"

    def get_security_definition(self, auto_schema: "AutoSchema") -> dict[str, Any]:
        return {"type": "http", "scheme": "bearer", "description": "An API key (mu_...)"}


def request_principal(request: Request) -> Principal:
    """Who is asking: the Principal authenticate() put on request.user (DRF's stubs can only say
    a Django user there). Views and permissions past IsAuthenticated always have one."""
    return cast(Principal, request.user)
