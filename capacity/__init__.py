"""Capacity: GPU types and pools, model-unit profiles, reservations, and the ledger.

The Django app (models.py, tasks.py) stores them. The pure modules (ledger.py, provisioning.py,
units.py and later fitting.py, autoscaler/, simulate/) import neither Django nor controlplane,
so the data plane and notebooks can use them.
"""
