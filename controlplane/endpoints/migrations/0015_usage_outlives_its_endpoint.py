"""Usage is the tenant's bill: each hour keeps its endpoint's id (no longer a cascading foreign
key), name and tenant, filled here from the endpoints of the rows there are; a deleted endpoint
leaves a DeletedEndpoint so that the seconds metered after its delete are billed to it."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def keep_name_and_tenant(apps, schema_editor):
    Endpoint = apps.get_model("endpoints", "Endpoint")
    UsageHour = apps.get_model("endpoints", "UsageHour")
    of_row = Endpoint.objects.filter(pk=OuterRef("endpoint_id"))
    UsageHour.objects.update(
        endpoint_name=Subquery(of_row.values("name")[:1]), tenant_id=Subquery(of_row.values("tenant_id")[:1])
    )


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0014_load_mu_squared"),
        ("tenants", "0003_tenant_gpu_quota"),
    ]

    operations = [
        migrations.AddField(
            model_name="usagehour",
            name="endpoint_name",
            field=models.CharField(default="", max_length=63),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="usagehour",
            name="tenant",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="usage",
                to="tenants.tenant",
            ),
        ),
        migrations.RunPython(keep_name_and_tenant, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="usagehour",
            name="tenant",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="usage", to="tenants.tenant"
            ),
        ),
        # The column stays (endpoint_id, bigint, in the unique constraint with start): first its
        # foreign key constraint and index go, then the state calls it a plain integer.
        migrations.AlterField(
            model_name="usagehour",
            name="endpoint",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="endpoints.endpoint",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="usagehour", name="usage_hour_unique"),
                migrations.RemoveField(model_name="usagehour", name="endpoint"),
                migrations.AddField(
                    model_name="usagehour",
                    name="endpoint_id",
                    field=models.BigIntegerField(default=0),
                    preserve_default=False,
                ),
                migrations.AddConstraint(
                    model_name="usagehour",
                    constraint=models.UniqueConstraint(
                        fields=("endpoint_id", "start"), name="usage_hour_unique"
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="DeletedEndpoint",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("endpoint_id", models.BigIntegerField(unique=True)),
                ("name", models.CharField(max_length=63)),
                ("deleted_at", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="deleted_endpoints",
                        to="tenants.tenant",
                    ),
                ),
            ],
            options={"ordering": ["-deleted_at"]},
        ),
    ]
