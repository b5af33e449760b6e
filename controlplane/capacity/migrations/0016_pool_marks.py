"""A pool's marks (PoolMark), which endpoints migration 0024 has PostgreSQL's triggers write, in
place of the stored ledger's fingerprint."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("capacity", "0015_reservation_largest_first"),
    ]

    operations = [
        migrations.RemoveField(model_name="storedledger", name="fingerprint"),
        migrations.CreateModel(
            name="PoolMark",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "pool",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="capacity.gpupool"
                    ),
                ),
            ],
        ),
    ]
