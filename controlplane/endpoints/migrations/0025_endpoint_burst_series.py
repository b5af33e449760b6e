from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0024_pool_marks"),
    ]

    operations = [
        migrations.AddField(
            model_name="endpoint",
            name="burst_series",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
