"""Who may write what: operators write the fleet; tenants write their own endpoints and keys."""

from rest_framework import permissions
from rest_framework.request import Request
from rest_framework.views import APIView

from controlplane.api.auth import request_principal
from controlplane.oncall.models import may_acknowledge


class OperatorWrites(permissions.BasePermission):
    message = "only operators may change this"

    def has_permission(self, request: Request, view: APIView) -> bool:
        return request.method in permissions.SAFE_METHODS or request_principal(request).is_operator


class OperatorOnly(permissions.BasePermission):
    message = "only operators may see this"

    def has_permission(self, request: Request, view: APIView) -> bool:
        return request_principal(request).is_operator


class MayAcknowledge(permissions.BasePermission):
    message = "only operators may acknowledge events"

    def has_permission(self, request: Request, view: APIView) -> bool:
        return may_acknowledge(request_principal(request))
