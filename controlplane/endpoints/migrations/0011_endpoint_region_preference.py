import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0010_endpoint_clamped_since"),
    ]

    operations = [
        migrations.AddField(
            model_name="endpoint",
            name="region_preference",
            field=models.CharField(
                blank=True,
                max_length=63,
                validators=[
                    django.core.validators.RegexValidator(
                        "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
                        "use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit",
                    )
                ],
            ),
        ),
    ]
