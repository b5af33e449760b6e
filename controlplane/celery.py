"""The Celery app: configured from Django settings (CELERY_*), tasks found in each app."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
