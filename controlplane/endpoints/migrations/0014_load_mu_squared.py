from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0013_endpoint_calm_since"),
    ]

    operations = [
        migrations.AddField(
            model_name="loadbucket",
            name="mu_squared_per_minute",
            field=models.FloatField(default=0.0),
        ),
    ]
