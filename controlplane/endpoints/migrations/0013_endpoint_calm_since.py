from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0012_pod_facts_and_latency_histogram"),
    ]

    operations = [
        migrations.AddField(
            model_name="endpoint",
            name="calm_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
