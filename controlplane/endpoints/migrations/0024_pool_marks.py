"""Pool marks (capacity.PoolMark): PostgreSQL triggers mark a pool whenever a write changes
what one of its endpoints is counted from (pool_ledgers._KEY_SQL but the reservation), in place
of the fingerprint a sale summed over the pool's endpoints. Stored groups written before are
dropped: no trigger saw the writes that came before them, so each pool's next sale reads it
whole."""

from django.db import migrations

# What an endpoint's replicas are counted from, per table: an UPDATE that changes none of these
# marks nothing (the autoscaler's metered MU, a name, a served model name).
ENDPOINT = ("pool_id", "profile_id", "min_provisioned_concurrency", "target_concurrency_per_replica",
            "scale_to_zero_enabled", "desired_replicas")  # fmt: skip
ROLLOUT = ("endpoint_id", "phase", "new_percent", "canary_percent", "promoted", "from_version",
           "to_version", "from_profile_id")  # fmt: skip
PROFILE = ("model", "gpus_per_replica", "mu_per_replica_minute")


def changed(columns: tuple[str, ...]) -> str:
    return " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in columns)


TRIGGERS = f"""
-- A mark for the pool, unless this transaction marked it already (a pass that updates a pool's
-- thousand endpoints leaves one); a mark made in a savepoint is not seen so, and is made again.
CREATE FUNCTION capacity_mark(pool bigint) RETURNS void LANGUAGE sql AS $$
    INSERT INTO capacity_poolmark (pool_id) SELECT pool WHERE pool IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM capacity_poolmark WHERE pool_id = pool AND xmin = pg_current_xact_id()::xid
    )
$$;

CREATE FUNCTION capacity_mark_endpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN PERFORM capacity_mark(OLD.pool_id); END IF;
    IF TG_OP <> 'DELETE' THEN PERFORM capacity_mark(NEW.pool_id); END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER capacity_mark_endpoint AFTER INSERT OR DELETE ON endpoints_endpoint
    FOR EACH ROW EXECUTE FUNCTION capacity_mark_endpoint();
CREATE TRIGGER capacity_mark_endpoint_update AFTER UPDATE ON endpoints_endpoint
    FOR EACH ROW WHEN ({changed(ENDPOINT)}) EXECUTE FUNCTION capacity_mark_endpoint();

-- An endpoint deleted first (a cascade in the database) has marked its pool already.
CREATE FUNCTION capacity_mark_rollout() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM capacity_mark(pool_id) FROM endpoints_endpoint WHERE id = OLD.endpoint_id;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        PERFORM capacity_mark(pool_id) FROM endpoints_endpoint WHERE id = NEW.endpoint_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER capacity_mark_rollout AFTER INSERT OR DELETE ON endpoints_rollout
    FOR EACH ROW EXECUTE FUNCTION capacity_mark_rollout();
CREATE TRIGGER capacity_mark_rollout_update AFTER UPDATE ON endpoints_rollout
    FOR EACH ROW WHEN ({changed(ROLLOUT)}) EXECUTE FUNCTION capacity_mark_rollout();

-- Every pool with an endpoint on the profile, or a rollout from it.
CREATE FUNCTION capacity_mark_profile() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM capacity_mark(pool_id) FROM (
        SELECT pool_id FROM endpoints_endpoint WHERE profile_id = NEW.id
        UNION SELECT e.pool_id FROM endpoints_rollout ro JOIN endpoints_endpoint e ON e.id = ro.endpoint_id
        WHERE ro.from_profile_id = NEW.id
    ) pools;
    RETURN NULL;
END $$;
CREATE TRIGGER capacity_mark_profile AFTER UPDATE ON capacity_modelprofile
    FOR EACH ROW WHEN ({changed(PROFILE)}) EXECUTE FUNCTION capacity_mark_profile();
"""

DROP = """
DROP TRIGGER IF EXISTS capacity_mark_endpoint ON endpoints_endpoint;
DROP TRIGGER IF EXISTS capacity_mark_endpoint_update ON endpoints_endpoint;
DROP TRIGGER IF EXISTS capacity_mark_rollout ON endpoints_rollout;
DROP TRIGGER IF EXISTS capacity_mark_rollout_update ON endpoints_rollout;
DROP TRIGGER IF EXISTS capacity_mark_profile ON capacity_modelprofile;
DROP FUNCTION IF EXISTS capacity_mark_endpoint();
DROP FUNCTION IF EXISTS capacity_mark_rollout();
DROP FUNCTION IF EXISTS capacity_mark_profile();
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
    apps.get_model("capacity", "StoredLedger").objects.update(groups=None)


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0023_autoscaler_removed_options"),
        ("capacity", "0016_pool_marks"),
    ]

    operations = [
        migrations.RunPython(drop_stored_groups, migrations.RunPython.noop),
        migrations.RunPython(on_postgresql(TRIGGERS), on_postgresql(DROP)),
    ]
