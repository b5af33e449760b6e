"""Pools become nodes of one shape (gpus_per_node; CPU and memory per node optional).

An existing pool keeps its gpu_count and gets the largest node of at most 8 GPUs that divides
it (16 -> 8 x 2 nodes, 12 -> 6 x 2, 10 -> 5 x 2, 4 -> 4 x 1), 8 being the common GPU server:
the rule a new pool gets when it names no shape (controlplane.capacity.models
.default_gpus_per_node, copied here as migrations do not import models).
When that node is narrower than a replica already placed there (a 13-GPU pool, whose largest
such divisor is 1, holding a 4-GPU model), the pool becomes one node of all its GPUs, as the
ledger saw it before, so that nothing placed there stops fitting; operators then set its real
shape through /api/v1/pools/ (a shape that strands a committed replica is refused with 409).
"""

import django.core.validators
from django.db import migrations, models


def node_size(gpu_count: int, widest_replica: int) -> int:
    if gpu_count == 0:
        return 8
    size = max(d for d in range(1, 9) if gpu_count % d == 0)
    return size if size >= widest_replica else gpu_count


def set_node_shapes(apps, schema_editor):
    GpuPool = apps.get_model("capacity", "GpuPool")
    Endpoint = apps.get_model("endpoints", "Endpoint")
    for pool in GpuPool.objects.all():
        widest = max(
            Endpoint.objects.filter(pool=pool).values_list("profile__gpus_per_replica", flat=True), default=1
        )
        pool.gpus_per_node = node_size(pool.gpu_count, widest)
        pool.save(update_fields=["gpus_per_node"])


class Migration(migrations.Migration):
    dependencies = [
        ("capacity", "0005_reservation_protects_its_endpoint"),
        ("endpoints", "0010_endpoint_clamped_since"),
    ]

    operations = [
        migrations.AddField(
            model_name="gpupool",
            name="gpus_per_node",
            field=models.PositiveSmallIntegerField(
                default=8,
                help_text="GPUs on each node of the pool",
                validators=[django.core.validators.MinValueValidator(1)],
            ),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="gpupool",
            name="cpu_millicores_per_node",
            field=models.PositiveIntegerField(
                blank=True, help_text="CPU of each node in millicores (unset: not a limit)", null=True
            ),
        ),
        migrations.AddField(
            model_name="gpupool",
            name="memory_mib_per_node",
            field=models.PositiveIntegerField(
                blank=True, help_text="Memory of each node in MiB (unset: not a limit)", null=True
            ),
        ),
        migrations.RunPython(set_node_shapes, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="gpupool",
            constraint=models.CheckConstraint(
                condition=models.Q(("gpus_per_node__gte", 1)), name="pool_gpus_per_node_positive"
            ),
        ),
    ]
