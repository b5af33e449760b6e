"""`Authorization: Bearer <api key>` -> a Principal (tenant member or operator)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from controlplane.tenants.models import ApiKey


class BearerKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None  # DRF answers 401 with the WWW-Authenticate below
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <api key>'")
        key = ApiKey.authenticate(secret.strip())
        if key is None:
            raise exceptions.AuthenticationFailed("API key is unknown or revoked")
        return key.principal, key

    def authenticate_header(self, request):
        return self.keyword


class BearerKeyScheme(OpenApiAuthenticationExtension):
    target_class = BearerKeyAuthentication
    name = "bearerKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An API key (mu_...)"}
