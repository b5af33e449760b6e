"""A stored ledger's groups as JSON text, not jsonb (capacity.models.JSONText): a sale writes
them whole every time, and PostgreSQL's parse into jsonb was most of that write. The stored
groups are kept (jsonb casts to text)."""

from django.db import migrations

import controlplane.capacity.models


class Migration(migrations.Migration):
    dependencies = [
        ("capacity", "0016_pool_marks"),
    ]

    operations = [
        migrations.AlterField(
            model_name="storedledger",
            name="groups",
            field=controlplane.capacity.models.JSONText(blank=True, null=True),
        ),
    ]
