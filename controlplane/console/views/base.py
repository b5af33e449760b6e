"""What every console view shares: the principal on the request, the partial/full rule.

``console_view`` is the one place a console view finds who is asking (a tenant member or an
operator) and whether they may see the page; the views scope their querysets by that principal
(``visible_to``). ``page`` renders the full template, or only the partial for htmx requests.
"""

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import redirect, render


def is_partial(request) -> bool:
    return request.headers.get("HX-Request") == "true" and not request.headers.get(
        "HX-History-Restore-Request"
    )


def console_view(operator_only: bool = False, section: str = ""):
    """Signs in, finds the user's principal (tenant member or operator) and puts it on the request."""

    def decorate(view):
        @login_required
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            member = getattr(request.user, "member", None)
            if member is None:
                raise PermissionDenied("this user belongs to no tenant and is not an operator")
            request.principal = member.principal
            request.section = section
            if operator_only and not request.principal.is_operator:
                raise PermissionDenied("only operators may see this page")
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def filled(query):
    """The query without empty values: a filter form's blank select means "any", not "''"."""
    params = query.copy()
    for key in list(params):
        values = [v for v in params.getlist(key) if v != ""]
        if values:
            params.setlist(key, values)
        else:
            del params[key]
    return params


def page(request, template: str, partial: str, context: dict) -> HttpResponse:
    return render(request, partial if is_partial(request) else template, context)


@console_view()
def home(request):
    return redirect("console:capacity" if request.principal.is_operator else "console:endpoints")
