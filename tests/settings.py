"""The test run's settings: the product's own, with a secret key for the tests.

With DATABASE_URL the control plane refuses to start without SECRET_KEY; the tests run that
production path (DEBUG unset) on PostgreSQL. The key goes into the environment, so that the
processes the tests start (Celery workers, manage.py) load the same settings.
"""

import os

os.environ.setdefault("SECRET_KEY", "tests-only-not-a-secret-" + "0123456789abcdefghijklmnopqrstuvwxyz")

from controlplane.settings import *  # noqa: F403
