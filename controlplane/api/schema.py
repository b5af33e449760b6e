"""The OpenAPI schema documents every operation's errors: the body controlplane.api.errors answers.

drf-spectacular lists the success responses from each view; this AutoSchema adds the 4xx an
operation can answer, all with the `ApiError` body: 400 (a bad field, query parameter or body),
401 (no valid key), 403 (a tenant doing what operators do), 404 (missing or another tenant's),
431 (a head over the web server's limit), and for writes 409 (a conflict: oversold, protected,
taken), 413 (too big) and 415 (not JSON).
"""

from typing import Any

from drf_spectacular import openapi
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


# The bodies' keys "errors" and "fields" are names a Serializer has as attributes, so these two
# declare their fields in get_fields() rather than as class attributes.
class FieldErrorSerializer(serializers.Serializer[Any]):
    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return {
            "errors": serializers.ListField(child=serializers.CharField()),
            "value": serializers.JSONField(required=False, help_text="The value sent, when there was one"),
        }


class ApiErrorSerializer(serializers.Serializer[Any]):
    """Every error's body; some carry more (a 409 `oversold` its pool's figures)."""

    class Meta:
        ref_name = "ApiError"

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return {
            "error": serializers.CharField(help_text="A code: invalid, not_found, permission_denied, ..."),
            "detail": serializers.CharField(help_text="What was wrong, in words"),
            "fields": serializers.DictField(
                child=FieldErrorSerializer(), required=False, help_text="400 invalid: each bad field's errors"
            ),
        }


ALWAYS = {
    "400": "A bad field, query parameter or body (each named in `fields`)",
    "401": "No API key, or an unknown or revoked one",
    "403": "Not for this principal (operators only)",
    "404": "Does not exist, or belongs to another tenant",
    "431": "The request line and headers exceed what the server reads (64 KiB)",
}
WRITES = {
    "409": "Conflicts with what exists: oversold, still in use, or taken",
    "413": "The body is larger than the server accepts",
    "415": "The body is not JSON",
}


class AutoSchema(openapi.AutoSchema):
    def _get_response_bodies(self, direction: Any = "response") -> Any:
        responses = super()._get_response_bodies(direction)
        errors = {**ALWAYS, **(WRITES if self.method in ("POST", "PUT", "PATCH", "DELETE") else {})}
        for code, description in errors.items():
            if code not in responses:
                body = OpenApiResponse(ApiErrorSerializer, description=description)
                responses[code] = self._get_response_for_code(body, code, direction=direction)  # type: ignore[no-untyped-call]
        return responses
