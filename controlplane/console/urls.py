from django.urls import path

from controlplane.console.views import base, capacity, endpoints, oncall

app_name = "console"
urlpatterns = [
    path("", base.home, name="home"),
    path("capacity/", capacity.capacity, name="capacity"),
    path("capacity/sell/", capacity.sell, name="sell"),
    path("capacity/preview/", capacity.preview, name="sell-preview"),
    path("capacity/endpoints/", capacity.sell_endpoints, name="sell-endpoints"),
    path("capacity/pools/<int:pk>/nodes/", capacity.pool_nodes, name="pool-nodes"),
    path("capacity/profiles/<int:pk>/benchmark/", capacity.rerun_benchmark, name="profile-benchmark"),
    path("endpoints/", endpoints.endpoints, name="endpoints"),
    path("endpoints/new/", endpoints.endpoint_form, name="endpoint-new"),
    path("endpoints/<int:pk>/", endpoints.endpoint_detail, name="endpoint"),
    path("endpoints/<int:pk>/edit/", endpoints.endpoint_form, name="endpoint-edit"),
    path("endpoints/<int:pk>/live/", endpoints.endpoint_live, name="endpoint-live"),
    path("oncall/", oncall.oncall, name="oncall"),
    path("oncall/tail/", oncall.oncall_tail, name="oncall-tail"),
    path("oncall/attention/", oncall.oncall_attention, name="oncall-attention"),
    path("oncall/events/<int:pk>/ack/", oncall.acknowledge, name="event-ack"),
    path("oncall/groups/", oncall.oncall_group_rows, name="oncall-groups"),
    path("oncall/groups/<int:pk>/ack/", oncall.group_acknowledge, name="group-ack"),
    path("oncall/groups/<int:pk>/resolve/", oncall.group_resolve, name="group-resolve"),
    path("oncall/groups/<int:pk>/silence/", oncall.group_silence, name="group-silence"),
    path("oncall/runbooks/<slug:kind>/", oncall.runbook, name="runbook"),
]
