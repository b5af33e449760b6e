"""The console's own error pages, with DEBUG off as every deployment and the embedded default run:
another tenant's endpoint is the console's 404 (no URL patterns), a failing view the console's
500 (no traceback, settings or SQL)."""

import pytest
from django.test import Client, override_settings
from django.urls import include, path


def failing_view(request):
    raise RuntimeError("SELECT secret FROM settings -- must not reach the page")


# The product's URLs and one view that fails, under the product's own error handlers.
urlpatterns = [path("boom/", failing_view), path("", include("controlplane.urls"))]

TECHNICAL = ("URLconf", "urlpatterns", "Traceback", "SECRET_KEY", "DATABASES", "Request Method")


def assert_console_page(response, heading):
    body = response.content.decode()
    assert f"<h1>{heading}</h1>" in body and "/static/console/console.css" in body, body
    assert not [word for word in TECHNICAL if word in body], body


def test_another_tenants_endpoint_is_the_consoles_404(other_web, owner, make_endpoint, settings):
    assert settings.DEBUG is False
    owned = make_endpoint(owner, "owner-secret-chat")
    answer = other_web.get(f"/console/endpoints/{owned.pk}/")
    assert answer.status_code == 404
    assert_console_page(answer, "Not found")
    assert "console/endpoints/&lt;int:pk&gt;" not in answer.content.decode()


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__)
def test_a_failing_view_shows_the_consoles_500_and_nothing_of_the_failure():
    answer = Client(raise_request_exception=False).get("/boom/")
    assert answer.status_code == 500
    assert_console_page(answer, "Server error")
    assert "SELECT" not in answer.content.decode() and "RuntimeError" not in answer.content.decode()
