from django.urls import include, path
from rest_framework.routers import DefaultRouter

from controlplane.api import metrics, root, usage, views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("tenants", views.TenantViewSet)
router.register("api-keys", views.ApiKeyViewSet)
router.register("gpu-types", views.GpuTypeViewSet)
router.register("pools", views.GpuPoolViewSet)
router.register("model-profiles", views.ModelProfileViewSet)
router.register("endpoints", views.EndpointViewSet)
router.register("pods", views.PodViewSet)
router.register("reservations", views.ReservationViewSet)
router.register("allowances", views.ProvisionedAllowanceViewSet)
router.register("events", views.EventViewSet)
router.register("capacity", views.CapacityViewSet, basename="capacity")

urlpatterns = [
    path("whoami/", views.whoami, name="whoami"),
    path("routing-table/", views.RoutingTableView.as_view(), name="routing-table"),
    path("routing-table/keys/<str:digest>/", views.RoutingKeyView.as_view(), name="routing-key"),
    path("load-samples/", views.LoadSamplesView.as_view(), name="load-samples"),
    path("usage/", usage.UsageView.as_view(), name="usage"),
    path("metrics/", metrics.MetricsView.as_view(), name="metrics"),
    path("", root.root_view(router), name="api-root"),
    path("", include(router.urls)),
]
