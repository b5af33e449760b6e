"""Who may write what: operators write the fleet; tenants write their own endpoints and keys."""

from rest_framework import permissions


class OperatorWrites(permissions.BasePermission):
    message = "only operators may change this"

    def has_permission(self, request, view):
        return request.method in permissions.SAFE_METHODS or request.user.is_operator


class OperatorOnly(permissions.BasePermission):
    message = "only operators may see this"

    def has_permission(self, request, view):
        return request.user.is_operator
