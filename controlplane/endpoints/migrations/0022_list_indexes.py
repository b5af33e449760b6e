import sys

from django.db import DatabaseError, migrations, models, transaction

# ?search= is a substring of the name, any case (icontains: UPPER(name) LIKE UPPER('%...%')): a
# trigram index on that expression finds the few names that hold it without reading every row.
# PostgreSQL only (pg_trgm, in Debian's postgresql package); SQLite, the embedded default, has
# no such index and scans, as it did.
TRIGRAM_INDEX = "endpoint_name_trigram"


def add_name_trigram_index(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        available = cursor.fetchone() is not None
    try:
        if not available:
            raise DatabaseError("pg_trgm is not installed with this PostgreSQL (its contrib modules)")
        with transaction.atomic(using=connection.alias):  # a savepoint: a refusal leaves the rest
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            schema_editor.execute(
                f"CREATE INDEX IF NOT EXISTS {TRIGRAM_INDEX} ON endpoints_endpoint"
                " USING gin (UPPER(name) gin_trgm_ops)"
            )
            schema_editor.execute("ANALYZE endpoints_endpoint")  # the planner's statistics of UPPER(name)
    except DatabaseError as exc:  # the lists still work: ?search= reads every name instead
        print(f"\n  endpoints: no trigram index for ?search= ({exc}); name search will scan", file=sys.stderr)


def drop_name_trigram_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {TRIGRAM_INDEX}")


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0021_tenant_usage_days"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="endpoint",
            name="endpoints_e_state_777659_idx",
        ),
        migrations.AddIndex(
            model_name="endpoint",
            index=models.Index(fields=["state", "-id"], name="endpoint_state_newest"),
        ),
        migrations.AddIndex(
            model_name="endpoint",
            index=models.Index(fields=["tenant", "-id"], name="endpoint_tenant_newest"),
        ),
        migrations.RunPython(add_name_trigram_index, drop_name_trigram_index, elidable=False),
    ]
