"""The control plane: tenants, API keys, endpoints, events, the REST API and the console.

A Django project. It holds the model of the world (who runs what, on which GPUs, with how much
capacity sold) and hands the data plane its routing table. Celery is wired here so that
`controlplane.celery_app` is loaded whenever Django is.
"""

from controlplane.celery import app as celery_app

__all__ = ("celery_app",)
