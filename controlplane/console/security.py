"""The Content-Security-Policy of every page the control plane serves: one middleware, one place.

The console runs no inline script and no inline style (htmx is a static file, configured by
``<meta name="htmx-config">`` not to inject its indicator styles nor to eval), so its policy
allows scripts, styles and connections to this origin only: a value a request manages to get
into a page unescaped still cannot run. Swagger UI (``/api/docs/``) is the one page that
needs more (its template's inline ``<style>``, its data: images); ``CSP_EXCEPTIONS`` names it.
"""

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

HEADER = "Content-Security-Policy"


def policy_for(path: str) -> str:
    """The policy of the page at ``path``: the strict one but where ``CSP_EXCEPTIONS`` says."""
    for prefix, policy in settings.CSP_EXCEPTIONS.items():
        if path.startswith(prefix):
            return str(policy)
    return str(settings.CSP_POLICY)


class ContentSecurityPolicyMiddleware:
    """Sets the policy on every response that has none of its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if HEADER not in response:
            response[HEADER] = policy_for(request.path)
        return response
