"""Capacity: the pure library of model units, the ledger, fitting, benchmark sweeps, the
autoscaler's deciders and the fleet simulator.

No module here imports Django, DRF, Celery or controlplane (tests/test_boundaries.py), so the
data plane, the control plane and notebooks can all use it. The Django app that stores GPU
types, pools, profiles and reservations is controlplane.capacity.
"""
