"""Pool marks (capacity.PoolMark): a PostgreSQL trigger marks a pool whenever a write changes what
one of its endpoints' rows says it is counted from, in place of the fingerprint a sale summed
over the pool's endpoints (what profiles and rollouts say, few rows, a sale still reads whole:
pool_ledgers.digest_sql). Stored groups written before are dropped: no trigger saw the writes
that came before them, so each pool's next sale reads it whole."""

from django.db import migrations

# What an endpoint's replicas are counted from in its own row: an UPDATE that changes none of
# these marks nothing (the autoscaler's metered MU, a name, a served model name).
COUNTED = ("pool_id", "profile_id", "min_provisioned_concurrency", "target_concurrency_per_replica",
           "scale_to_zero_enabled", "desired_replicas")  # fmt: skip

TRIGGERS = f"""
-- A mark for the pool, unless this transaction marked it already (a pass that updates a pool's
-- thousand endpoints leaves one); a mark made in a savepoint is not seen so, and is made again.
CREATE FUNCTION capacity_mark(pool bigint) RETURNS void LANGUAGE sql AS $$
    INSERT INTO capacity_poolmark (pool_id) SELECT pool WHERE NOT EXISTS (
        SELECT 1 FROM capacity_poolmark WHERE pool_id = pool AND xmin = pg_current_xact_id()::xid
    )
$$;

-- The pools an endpoint's row leaves and joins: from the row itself, never from a read of
-- other rows, which a concurrent transaction may be changing unseen.
CREATE FUNCTION capacity_mark_endpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN PERFORM capacity_mark(OLD.pool_id); END IF;
    IF TG_OP <> 'DELETE' THEN PERFORM capacity_mark(NEW.pool_id); END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER capacity_mark_endpoint AFTER INSERT OR DELETE ON endpoints_endpoint
    FOR EACH ROW EXECUTE FUNCTION capacity_mark_endpoint();
CREATE TRIGGER capacity_mark_endpoint_update AFTER UPDATE ON endpoints_endpoint
    FOR EACH ROW WHEN ({" OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in COUNTED)})
    EXECUTE FUNCTION capacity_mark_endpoint();

-- A TRUNCATE passes row triggers by: every pool.
CREATE FUNCTION capacity_mark_every_pool() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM capacity_mark(id) FROM capacity_gpupool;
    RETURN NULL;
END $$;
CREATE TRIGGER capacity_mark_truncated AFTER TRUNCATE ON endpoints_endpoint
    FOR EACH STATEMENT EXECUTE FUNCTION capacity_mark_every_pool();
"""

DROP = """
DROP TRIGGER IF EXISTS capacity_mark_endpoint ON endpoints_endpoint;
DROP TRIGGER IF EXISTS capacity_mark_endpoint_update ON endpoints_endpoint;
DROP TRIGGER IF EXISTS capacity_mark_truncated ON endpoints_endpoint;
DROP FUNCTION IF EXISTS capacity_mark_endpoint();
DROP FUNCTION IF EXISTS capacity_mark_every_pool();
DROP FUNCTION IF EXISTS capacity_mark(bigint);
"""


def on_postgresql(sql: str):
    """Run `sql` on PostgreSQL only: SQLite takes no stored groups (selling.check_sale reads
    the pool), so it needs no marks."""

    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


def drop_stored_groups(apps, schema_editor):
    apps.get_model("capacity", "StoredLedger").objects.update(groups=None, digest="")


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0023_autoscaler_removed_options"),
        ("capacity", "0016_pool_marks"),
    ]

    operations = [
        migrations.RunPython(drop_stored_groups, migrations.RunPython.noop),
        migrations.RunPython(on_postgresql(TRIGGERS), on_postgresql(DROP)),
    ]
