"""Every response under /api/ is JSON: the one place for what DRF's exception handler never sees.

DRF's views answer their own errors (controlplane.api.errors). What happens outside them is
Django's, and Django answers HTML: an unknown path or an id the URL pattern refuses (404), a
method or a redirect of the URL layer, a body over DATA_UPLOAD_MAX_MEMORY_SIZE read outside a
view (413), a bad Host (400), a bug (500). This middleware, the outermost, gives those the API's
body `{"error": code, "detail": text}` and keeps their status and headers; a 500 says only
"internal" (the traceback goes to the log, as Django logs it). It also refuses a NUL character in
any query parameter with a 400 naming the parameter, before any view reads one.
"""

from collections.abc import Callable

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse

from controlplane.api.parsers import NUL, NUL_MESSAGE

API_PREFIX = "/api/"

CODES = {
    400: "bad_request",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    431: "head_too_large",
    500: "internal",
}
DETAILS = {
    404: "Not found.",
    413: "The request body is larger than the server accepts.",
    431: "The request line and headers are larger than the server accepts.",
    500: "Internal error; it has been logged.",
}
KEPT_HEADERS = ("Location", "Allow", "Retry-After", "WWW-Authenticate", "Vary")


def api_error(status: int, code: str, detail: str, **extra: object) -> JsonResponse:
    return JsonResponse({"error": code, "detail": detail, **extra}, status=status)


def is_json(response: HttpResponseBase) -> bool:
    return "json" in response.get("Content-Type", "")


class ApiErrorsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not request.path_info.startswith(API_PREFIX):
            return self.get_response(request)
        refused = self.refuse_query(request)
        response = refused if refused is not None else self.get_response(request)
        if response.status_code < 300 or response.status_code == 304 or response.streaming:
            return response
        if is_json(response):
            return response
        return self.as_json(response)

    def refuse_query(self, request: HttpRequest) -> HttpResponse | None:
        try:
            params = request.GET
        except SuspiciousOperation as exc:  # too many parameters (DATA_UPLOAD_MAX_NUMBER_FIELDS)
            return api_error(400, "bad_request", str(exc))
        for name in params:
            if NUL in name:
                return api_error(400, "invalid", f"a query parameter's name {NUL_MESSAGE}", fields={})
            if any(NUL in value for value in params.getlist(name)):
                return api_error(
                    400, "invalid", f"{name}: {NUL_MESSAGE}", fields={name: {"errors": [NUL_MESSAGE]}}
                )
        return None

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        """A too-big body read by a view that is not DRF's (DRF's are mapped in errors.py)."""
        if request.path_info.startswith(API_PREFIX) and isinstance(exc, RequestDataTooBig):
            return api_error(413, CODES[413], DETAILS[413])
        return None

    def as_json(self, response: HttpResponseBase) -> HttpResponseBase:
        status = response.status_code
        if 300 <= status < 400:
            body = api_error(status, "moved", f"see {response.get('Location', '')}")
        else:
            code = CODES.get(status, "internal" if status >= 500 else "error")
            detail = DETAILS.get(status) or ("Internal error." if status >= 500 else response.reason_phrase)
            body = api_error(status, code, detail)
        for header in KEPT_HEADERS:
            if header in response:
                body[header] = response[header]
        return body
