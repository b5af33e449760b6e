"""Two autoscaler options measured worse and removed (docs/autoscaler.md, "Measured and
removed"): an endpoint's stored overrides lose them, and keep the rest. Left in, they would make
its stored settings unknown, and it would be decided on the defaults instead of its own."""

from django.db import migrations

REMOVED = ("smooth_spread", "drain_backlog_at_ready")


def drop_removed_options(apps, schema_editor):
    Endpoint = apps.get_model("endpoints", "Endpoint")
    for endpoint in Endpoint.objects.exclude(autoscaler={}).only("pk", "autoscaler").iterator():
        overrides = endpoint.autoscaler
        if isinstance(overrides, dict) and any(key in overrides for key in REMOVED):
            kept = {key: value for key, value in overrides.items() if key not in REMOVED}
            Endpoint.objects.filter(pk=endpoint.pk).update(autoscaler=kept)


class Migration(migrations.Migration):
    dependencies = [("endpoints", "0022_list_indexes")]

    operations = [migrations.RunPython(drop_removed_options, migrations.RunPython.noop)]
