"""The autoscaler's cadence is the control plane's (AUTOSCALER_*_INTERVAL_S): per-endpoint
`tick_s` and `vertical_tick_s` overrides were accepted and read by nothing, and are now refused;
drop any that are stored so every endpoint's settings stay valid."""

from django.db import migrations

CADENCE_KEYS = ("tick_s", "vertical_tick_s")


def drop_cadence_overrides(apps, schema_editor):
    Endpoint = apps.get_model("endpoints", "Endpoint")
    for endpoint in Endpoint.objects.only("pk", "autoscaler").iterator():
        kept = {k: v for k, v in endpoint.autoscaler.items() if k not in CADENCE_KEYS}
        if kept != endpoint.autoscaler:
            Endpoint.objects.filter(pk=endpoint.pk).update(autoscaler=kept)


class Migration(migrations.Migration):
    dependencies = [("endpoints", "0007_load_minutes")]

    operations = [migrations.RunPython(drop_cadence_overrides, migrations.RunPython.noop)]
