from django.urls import path

from controlplane.console import views

app_name = "console"
urlpatterns = [
    path("", views.home, name="home"),
    path("capacity/", views.capacity, name="capacity"),
    path("capacity/sell/", views.sell, name="sell"),
    path("capacity/profiles/<int:pk>/benchmark/", views.rerun_benchmark, name="profile-benchmark"),
    path("endpoints/", views.endpoints, name="endpoints"),
    path("endpoints/new/", views.endpoint_form, name="endpoint-new"),
    path("endpoints/<int:pk>/", views.endpoint_detail, name="endpoint"),
    path("endpoints/<int:pk>/edit/", views.endpoint_form, name="endpoint-edit"),
    path("endpoints/<int:pk>/live/", views.endpoint_live, name="endpoint-live"),
    path("oncall/", views.oncall, name="oncall"),
    path("oncall/tail/", views.oncall_tail, name="oncall-tail"),
    path("oncall/attention/", views.oncall_attention, name="oncall-attention"),
    path("oncall/events/<int:pk>/ack/", views.acknowledge, name="event-ack"),
]
