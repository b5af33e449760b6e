from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView


@transaction.non_atomic_requests  # the request's transaction would connect first, and fail as a 500
def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness and readiness for the kubelet: the process answers and the database does too."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any database failure means "not ready", said plainly
        return HttpResponse(
            f"database unavailable: {exc.__class__.__name__}", status=503, content_type="text/plain"
        )
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    # Pages without the console's <link rel="icon"> (the API's JSON, a bare 404) still find one.
    path("favicon.ico", RedirectView.as_view(url=static("console/favicon.svg"), permanent=True)),
    path("api/v1/", include("controlplane.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # An HTML page only: no OPTIONS metadata (DRF renders it with the page's HTML renderer, which
    # has no template for it: a 500), so OPTIONS is a 405 like any method the page does not take.
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="schema", metadata_class=None),
        name="api-docs",
    ),
    path("console/", include("controlplane.console.urls")),
    # Sign-in, sign-out and password change; no password reset (the control plane sends no mail).
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/password_change/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path(
        "accounts/password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path("", RedirectView.as_view(url="/console/", permanent=False)),
]
if settings.ADMIN_ENABLED:  # off unless the setting turns it on: one less sign-in to attack
    urlpatterns.append(path("admin/", admin.site.urls))
