"""What every console view shares: the principal on the request, the partial/full rule.

``console_view`` is the one place a console view finds who is asking (a tenant member or an
operator) and whether they may see the page; it hands the view a ``ConsoleRequest`` (the request
with that principal on it, typed), and the views scope their querysets by that principal
(``visible_to``). ``page`` renders the full template, or only the partial for htmx requests.
"""

from collections.abc import Callable
from functools import wraps
from typing import Any, Concatenate, ParamSpec, cast

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.utils.html import format_html_join

from controlplane.tenants.models import Principal

_P = ParamSpec("_P")


class ConsoleRequest(HttpRequest):
    """The request a console view is given: Django's HttpRequest with the signed-in user's
    principal and the console section (for the navigation bar) on it. Only a type: the object is
    Django's own, and ``console_view``, which sets the two, is the one place that casts to it."""

    principal: Principal
    section: str


ConsoleView = Callable[Concatenate[ConsoleRequest, _P], HttpResponse]  # a view as written
View = Callable[Concatenate[HttpRequest, _P], HttpResponse]  # the view the URLconf routes to


def is_partial(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true" and not request.headers.get(
        "HX-History-Restore-Request"
    )


def console_view(operator_only: bool = False, section: str = "") -> Callable[[ConsoleView[_P]], View[_P]]:
    """Signs in, finds the user's principal (tenant member or operator) and puts it on the request."""

    def decorate(view: ConsoleView[_P]) -> View[_P]:
        @login_required
        @wraps(view)
        def wrapper(request: HttpRequest, /, *args: _P.args, **kwargs: _P.kwargs) -> HttpResponse:
            member = getattr(request.user, "member", None)
            if member is None:
                raise PermissionDenied("this user belongs to no tenant and is not an operator")
            console_request = cast(ConsoleRequest, request)  # the two lines below make it one
            console_request.principal = member.principal
            console_request.section = section
            if operator_only and not console_request.principal.is_operator:
                raise PermissionDenied("only operators may see this page")
            return view(console_request, *args, **kwargs)

        return wrapper

    return decorate


def filled(query: QueryDict) -> QueryDict:
    """The query without empty values: a filter form's blank select means "any", not "''"."""
    params = query.copy()
    for key in list(params):
        values = [v for v in params.getlist(key) if v != ""]
        if values:
            params.setlist(key, values)
        else:
            del params[key]
    return params


def refused_parameters(errors: dict[str, list[str]]) -> HttpResponse:
    """A partial's 400 for query parameters its filters refuse: each named with what is wrong
    (htmx swaps it into the page, so what it echoes is escaped)."""
    text = format_html_join(" ", "{}: {}", ((name, " ".join(msgs)) for name, msgs in errors.items()))
    return HttpResponse(text, status=400)


def page(request: HttpRequest, template: str, partial: str, context: dict[str, Any]) -> HttpResponse:
    return render(request, partial if is_partial(request) else template, context)


@console_view()
def home(request: ConsoleRequest) -> HttpResponse:
    return redirect("console:capacity" if request.principal.is_operator else "console:endpoints")
