"""The capacity app: GPU types, pools, model-unit profiles, their fits, reservations and ledger
snapshots (app label `capacity`, so its tables and migrations are those of the old top-level
app). The pure rules are in the capacity package; the selling rules over these tables are
controlplane.selling, and the benchmarks, the snapshots' task and the `benchmark` command are
above the apps too (controlplane.profile_benchmarks, controlplane.tasks, controlplane.management).
"""
