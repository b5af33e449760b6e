"""ASGI entry point: the production web server's (controlplane/gunicorn.conf.py, uvicorn workers).

Django's app behind ``BoundedApp``: a bounded number of requests inside Django per worker, each
with its body already read, a body over DATA_UPLOAD_MAX_MEMORY_SIZE refused with 413 before
Django reads it, /healthz and static files on slots of their own (controlplane/webserver.py).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

from django.conf import settings  # after the settings module is named
from django.core.asgi import get_asgi_application

# Under ASGI each request's sync view runs in a thread of its own, which ends with the request:
# a persistent connection (CONN_MAX_AGE > 0) would outlive it unused, open until garbage
# collection, and 80 concurrent clients ran PostgreSQL out of connections. Each request closes
# its own instead (set before Django sets up its connections).
for database in settings.DATABASES.values():
    database["CONN_MAX_AGE"] = 0
django_application = get_asgi_application()

from controlplane.webserver import BoundedApp  # noqa: E402 - after Django is set up

application = BoundedApp(
    django_application,
    max_body_bytes=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
    static_prefix="/" + settings.STATIC_URL.lstrip("/"),
)
