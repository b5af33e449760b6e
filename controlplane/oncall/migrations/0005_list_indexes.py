import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("oncall", "0004_event_groups"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="eventgroup",
            name="oncall_even_tenant__26eb2a_idx",
        ),
        migrations.AlterField(
            model_name="event",
            name="endpoint",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="events",
                to="endpoints.endpoint",
            ),
        ),
        migrations.AlterField(
            model_name="event",
            name="group",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="events",
                to="oncall.eventgroup",
            ),
        ),
        migrations.AlterField(
            model_name="event",
            name="tenant",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="events",
                to="tenants.tenant",
            ),
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(fields=["tenant", "kind", "time"], name="oncall_event_tenant_kind_time"),
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(fields=["pod", "-id"], name="oncall_event_pod_newest"),
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                condition=models.Q(("acknowledged_at__isnull", False)),
                fields=["-id"],
                name="oncall_event_acknowledged",
            ),
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(fields=["group", "time"], name="oncall_event_group_time"),
        ),
        migrations.AddIndex(
            model_name="eventgroup",
            index=models.Index(
                models.Case(
                    models.When(state="open", then=0), models.When(state="acknowledged", then=1), default=2
                ),
                models.Case(
                    models.When(severity="critical", then=0),
                    models.When(severity="warning", then=1),
                    default=2,
                ),
                models.OrderBy(models.F("last_at"), descending=True),
                models.OrderBy(models.F("id"), descending=True),
                name="oncall_group_on_call",
            ),
        ),
        migrations.AddIndex(
            model_name="eventgroup",
            index=models.Index(
                models.F("tenant"),
                models.Case(
                    models.When(state="open", then=0), models.When(state="acknowledged", then=1), default=2
                ),
                models.Case(
                    models.When(severity="critical", then=0),
                    models.When(severity="warning", then=1),
                    default=2,
                ),
                models.OrderBy(models.F("last_at"), descending=True),
                models.OrderBy(models.F("id"), descending=True),
                name="oncall_group_tenant_on_call",
            ),
        ),
        migrations.AddIndex(
            model_name="eventgroup",
            index=models.Index(
                condition=models.Q(("state", "resolved")),
                fields=["resolved_at"],
                name="oncall_group_resolved_at",
            ),
        ),
    ]
