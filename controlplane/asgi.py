"""ASGI entry point: the production web server's (controlplane/gunicorn.conf.py, uvicorn workers)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
application = get_asgi_application()
