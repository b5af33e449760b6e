from django.db import migrations, models


def served_under_their_names(apps, schema_editor):
    """Pods already running serve their endpoint's name (they were started with it): keep it."""
    Endpoint = apps.get_model("endpoints", "Endpoint")
    Endpoint.objects.update(served_model_name=models.F("name"))


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0015_usage_outlives_its_endpoint"),
    ]

    operations = [
        migrations.AddField(
            model_name="endpoint",
            name="served_model_name",
            field=models.CharField(default="", editable=False, max_length=63),
            preserve_default=False,
        ),
        migrations.RunPython(served_under_their_names, migrations.RunPython.noop),
    ]
