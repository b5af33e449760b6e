"""The test run's settings: the product's own, with a secret key for the tests.

With DATABASE_URL the control plane refuses to start without SECRET_KEY; the tests run that
production path (DEBUG unset) on PostgreSQL. The key goes into the environment, so that the
processes the tests start (Celery workers, manage.py) load the same settings.
"""

import os
from urllib.parse import urlsplit

os.environ.setdefault("SECRET_KEY", "tests-only-not-a-secret-" + "0123456789abcdefghijklmnopqrstuvwxyz")

# Under pytest-xdist (`make test-fast` runs two workers) each worker has a Redis database of its
# own, as it has its own test database: tests delete and publish shared keys (the routing table).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and os.environ.get("REDIS_URL"):
    _url = urlsplit(os.environ["REDIS_URL"])
    _base = int(_url.path.lstrip("/") or 0)
    os.environ["REDIS_URL"] = _url._replace(path=f"/{(_base - int(_worker[2:])) % 16}").geturl()

from controlplane.settings import *  # noqa: E402, F403 (after the environment it reads)
