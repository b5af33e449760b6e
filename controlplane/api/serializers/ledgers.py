"""The pools' ledgers as /capacity/ shows them (capacity.ledger.PoolLedger beside its pool), with
the packing's nodes on request: read only."""

from typing import Any

from rest_framework import serializers

from controlplane import pool_ledgers
from controlplane.api.serializers.base import ExactNumberField, FastAnswer


class ModelCapacitySerializer(FastAnswer, serializers.Serializer[Any]):
    model = serializers.CharField()
    gpus_per_replica = serializers.IntegerField(source="shape.gpus_per_replica")
    mu_per_replica_minute = serializers.IntegerField(source="shape.mu_per_replica_minute")
    have_replicas = serializers.IntegerField(help_text="If the whole pool ran only this model")
    more_replicas = serializers.IntegerField(help_text="Replicas of it that still fit on the nodes")
    have_mu_per_minute = ExactNumberField(
        help_text="have_replicas x mu_per_replica_minute: what this model alone would fill the pool"
        " with; no sale moves it"
    )
    headroom_mu_per_minute = ExactNumberField(
        help_text="more_replicas x mu_per_replica_minute x over-commit: what could still be sold of it"
    )


class PlacedReplicaSerializer(FastAnswer, serializers.Serializer[Any]):
    endpoint_id = serializers.SerializerMethodField()
    endpoint = serializers.CharField(
        source="label", help_text="tenant/endpoint (and its version, while a rollout runs: both are placed)"
    )
    model = serializers.CharField()
    gpus = serializers.IntegerField()

    def get_endpoint_id(self, replica: Any) -> int:
        return pool_ledgers.endpoint_of_key(replica.key)


class NodeUseSerializer(FastAnswer, serializers.Serializer[Any]):
    index = serializers.IntegerField()
    gpus = serializers.IntegerField()
    free_gpus = serializers.IntegerField()
    replicas = PlacedReplicaSerializer(many=True)


class PoolCapacitySerializer(FastAnswer, serializers.Serializer[Any]):
    """One pool's ledger (capacity.ledger.PoolLedger) beside the pool it describes."""

    id = serializers.IntegerField(source="pool.pk")
    pool = serializers.CharField(source="pool.name")
    gpu_type = serializers.CharField(source="pool.gpu_type.name")
    region = serializers.CharField(source="pool.region")
    cluster = serializers.CharField(source="pool.cluster")
    node_count = serializers.IntegerField(source="ledger.node_count")
    gpus_per_node = serializers.IntegerField(source="ledger.gpus_per_node")
    overcommit = ExactNumberField(source="ledger.overcommit")
    have_gpus = serializers.IntegerField(
        source="ledger.have_gpus", help_text="The pool's have: node_count x gpus_per_node"
    )
    sellable_gpus = ExactNumberField(
        source="ledger.sellable_gpus", help_text="GPUs that may be committed: all of them"
    )
    committed_replicas = serializers.IntegerField(
        source="ledger.committed_replicas",
        help_text="Per endpoint the larger of its sold replicas and its minimum replicas, summed;"
        " while a rollout runs, each version's share of the larger of that and its desired replicas",
    )
    committed_gpus = ExactNumberField(
        source="ledger.committed_gpus", help_text="The committed replicas' GPUs: what the pool must place"
    )
    sold_replicas = serializers.IntegerField(
        source="ledger.sold_replicas", help_text="Per endpoint ceil(reserved MU/min / a replica's)"
    )
    sold_gpus = ExactNumberField(source="ledger.sold_gpus", help_text="The sold replicas' GPUs")
    used_gpus = ExactNumberField(
        source="ledger.used_gpus", help_text="Held by running replicas: ready pods x gpus_per_replica"
    )
    free_gpus = serializers.IntegerField(source="ledger.free_gpus", help_text="Left free by the packing")
    stranded_gpus = serializers.IntegerField(
        source="ledger.stranded_gpus", help_text="Free GPUs no replica of a model placed here can use"
    )
    headroom_gpus = ExactNumberField(source="ledger.headroom_gpus", help_text="free_gpus - stranded_gpus")
    unplaced_replicas = serializers.IntegerField(source="ledger.unplaced_replicas")
    have_mu_per_minute = ExactNumberField(
        source="ledger.have_mu_per_minute",
        help_text="The mean of models[].have_mu_per_minute (what each model placed here would fill"
        " the pool with alone), or with none placed have_gpus x the default MU/min per GPU: it"
        " moves with the pool's nodes and models, never with a sale. Read MU/min per model",
    )
    sellable_mu_per_minute = ExactNumberField(
        source="ledger.sellable_mu_per_minute", help_text="have_mu_per_minute x overcommit"
    )
    committed_mu_per_minute = ExactNumberField(
        source="ledger.committed_mu_per_minute", help_text="The committed replicas' MU/min"
    )
    sold_mu_per_minute = ExactNumberField(source="ledger.sold_mu_per_minute", help_text="Reserved, as sold")
    used_mu_per_minute = ExactNumberField(
        source="ledger.used_mu_per_minute",
        help_text="Metered by the routers: the endpoints' MU/min as the autoscaler last read them",
    )
    headroom_mu_per_minute = ExactNumberField(
        source="ledger.headroom_mu_per_minute",
        help_text="The mean of models[].headroom_mu_per_minute, or with no model placed"
        " headroom_gpus x the default MU/min per GPU x overcommit",
    )
    oversold = serializers.BooleanField(source="ledger.oversold")
    models = ModelCapacitySerializer(source="ledger.models", many=True)
    version = serializers.IntegerField(
        source="stored.version", help_text="The pool's stored ledger: one more for each write that changed it"
    )
    computed_at = serializers.DateTimeField(source="stored.computed_at")


class PoolNodesSerializer(PoolCapacitySerializer):
    """A pool's ledger with its placement (?nodes=true): read and packed live."""

    nodes = NodeUseSerializer(source="ledger.nodes", many=True, help_text="Which replica occupies what")
