"""GET /api/v1/: the API's root, a JSON map of its collections and documents (no data, so no
key is needed), instead of a 404 that a newcomer's first request meets."""

from django.urls import NoReverseMatch, reverse
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import BaseRouter

# The views that are not a router's collection, by URL name: (name in the answer, URL name).
SINGLE_VIEWS = [
    ("whoami", "whoami"),
    ("routing-table", "routing-table"),
    ("load-samples", "load-samples"),
    ("usage", "usage"),
    ("schema", "schema"),
    ("docs", "api-docs"),
]


def root_view(router: BaseRouter):  # type: ignore[no-untyped-def]
    """The root view of `router`'s collections and SINGLE_VIEWS, with absolute URLs."""

    @extend_schema(responses={200: dict}, summary="Links to every collection of the API")
    @api_view(["GET"])
    @authentication_classes([])
    @permission_classes([AllowAny])
    def api_root(request: Request) -> Response:
        links: dict[str, str] = {}
        for prefix, _, basename in router.registry:
            links[prefix] = request.build_absolute_uri(reverse(f"{basename}-list"))
        for name, url_name in SINGLE_VIEWS:
            try:
                links[name] = request.build_absolute_uri(reverse(url_name))
            except NoReverseMatch:  # a view a deployment leaves out
                continue
        return Response(
            {
                "api": "Inference control plane API, version 1",
                "authentication": "Authorization: Bearer <API key> (operators and tenants)",
                "links": links,
            }
        )

    return api_root
