"""Who may write what: operators write the fleet; tenants write their own endpoints and keys."""

from rest_framework import permissions
from rest_framework.request import Request
from rest_framework.views import APIView

from controlplane.api.auth import request_principal
from controlplane.oncall.models import may_acknowledge
from controlplane.tenants.models import PodPrincipal
from dataplane.wire import pod_events


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


class OwnPodEvents(permissions.BasePermission):
    """A pod's events credential posts events, and only its own endpoint's and of the kinds pods
    report (hang, restart, crash loop): the body's `endpoint` must be its endpoint (checked
    before the body is read any further)."""

    message = "an events credential only posts its own endpoint's events"

    def has_permission(self, request: Request, view: APIView) -> bool:
        principal = request.user
        if not isinstance(principal, PodPrincipal) or request.method != "POST":
            return False
        if getattr(view, "action", None) != "create":
            return False
        data = request.data
        return (
            hasattr(data, "get")
            and data.get("endpoint") == principal.endpoint_id
            and data.get("kind") in pod_events.KINDS
        )
