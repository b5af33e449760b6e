"""Existing endpoints keep the pods they have (endpoints 0016): each one's served name is its
name at the upgrade, the name its running pods were started with, so the first pass after the
upgrade declares the same deployments and restarts nothing."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from controlplane.endpoints.models import Endpoint
from tests.migrating import back_to_endpoints, endpoint_world


@pytest.mark.django_db(transaction=True)
def test_existing_endpoints_serve_the_name_their_pods_were_started_with():
    old, leaves = back_to_endpoints("0014_load_mu_squared")
    world = endpoint_world(old)
    for name in ("chat", "support-bot"):
        old.get_model("endpoints", "Endpoint").objects.create(
            **world, name=name, max_provisioned_concurrency=8, target_concurrency_per_replica=8
        )

    MigrationExecutor(connection).migrate(leaves)

    served = dict(Endpoint.objects.values_list("name", "served_model_name"))
    assert served == {"chat": "chat", "support-bot": "support-bot"}
