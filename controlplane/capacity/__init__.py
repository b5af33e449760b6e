"""The capacity app: GPU types, pools, model-unit profiles, their fits, reservations and ledger
snapshots (app label `capacity`, so its tables and migrations are those of the old top-level
app), its Celery tasks and the `benchmark` command. The pure rules are in the capacity package;
the selling rules over these tables are controlplane.selling.
"""
