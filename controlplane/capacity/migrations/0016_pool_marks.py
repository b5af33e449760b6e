"""A pool's marks (PoolMark), which endpoints migration 0024 has PostgreSQL's triggers write, and
the stored ledger's digest of the profiles and rollouts its groups were counted from, in place
of its fingerprint."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("capacity", "0015_reservation_largest_first"),
    ]

    operations = [
        migrations.RenameField(model_name="storedledger", old_name="fingerprint", new_name="digest"),
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
