"""Billing apart from the buckets: each router's mark (the last second taken from it, its
idempotency key), and whether a posted row was billed. The collector gets a lease of its own;
it starts where the horizontal pass, which collected before, left off, and the rows that pass
had billed (those of the slots before its cursor) are marked billed."""

import django.utils.timezone
from django.db import migrations, models


def carry_the_cursor(apps, schema_editor):
    Lease = apps.get_model("endpoints", "Lease")
    RouterSample = apps.get_model("endpoints", "RouterSample")
    cursor = Lease.objects.filter(name="autoscaler-horizontal").values_list("cursor", flat=True).first() or 0
    Lease.objects.get_or_create(name="collector", defaults={"cursor": cursor})
    RouterSample.objects.filter(models.Q(second__lt=cursor) | models.Q(endpoint_id=0)).update(billed=True)


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0016_endpoint_served_model_name"),
    ]

    operations = [
        migrations.CreateModel(
            name="RouterMark",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("router", models.CharField(max_length=80, unique=True)),
                ("second", models.BigIntegerField(default=0)),
                ("updated_at", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
            ],
        ),
        migrations.AddField(
            model_name="routersample",
            name="billed",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="routersample",
            name="router",
            field=models.CharField(default="", max_length=80),
        ),
        migrations.AddIndex(
            model_name="routersample",
            index=models.Index(
                condition=models.Q(("billed", False)), fields=["id"], name="router_sample_unbilled"
            ),
        ),
        migrations.RunPython(carry_the_cursor, migrations.RunPython.noop),
    ]
