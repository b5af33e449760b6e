"""Settings, all read from the environment (controlplane.env fails loudly on bad values).

With no variables set this is the embedded default: SQLite under var/ (700, its files 600), Celery
on the Redis that `make run` starts on a unix socket under var/, DEBUG off, a secret key made once
under var/. Production sets DATABASE_URL (postgres://...), REDIS_URL, SECRET_KEY (required with
DATABASE_URL), ALLOWED_HOSTS and, behind a TLS-terminating proxy, BEHIND_TLS_PROXY=1.
"""

import shlex
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from capacity import units
from controlplane.env import envbool, envdatabase, envfloat, envint, envlist, envstr, kombu_redis_url
from controlplane.localfiles import local_secret_key, private_var_dir
from dataplane.cluster import pod_args

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(envstr("CONTROLPLANE_VAR_DIR", str(BASE_DIR / "var")))

# --- Safe defaults: DEBUG, SECRET_KEY, ALLOWED_HOSTS, TLS ---------------------------------------
# The embedded default is the SQLite database under var/ (no DATABASE_URL): one machine, what
# `make run` and manage.py commands on a checkout use. DEBUG is on only when set (DEBUG=1, for a
# developer who asks for it), never by default: a process started without it shows no debug page.
EMBEDDED = not envstr("DATABASE_URL", "")
DEBUG = envbool("DEBUG", False)
if EMBEDDED:
    # The database, its -wal/-journal files, the broker's files, logs and keys: this user's alone
    # (another local user who reads the database reads the sessions in it).
    private_var_dir(VAR_DIR)
# Without SECRET_KEY the embedded default (or DEBUG=1) signs with a key of its own, made once
# under var/ (mode 600) and kept: sessions survive a restart, and no public key signs anything.
# Anything else refuses to start without SECRET_KEY.
SECRET_KEY = envstr("SECRET_KEY", "")
if not SECRET_KEY:
    if not (EMBEDDED or DEBUG):
        raise ImproperlyConfigured(
            "SECRET_KEY is not set: with DATABASE_URL the control plane needs a secret key of its own "
            "(50+ random characters: python -c 'import secrets; print(secrets.token_urlsafe(50))'); "
            "a key made under CONTROLPLANE_VAR_DIR serves only without DATABASE_URL or with DEBUG=1"
        )
    SECRET_KEY = local_secret_key(VAR_DIR)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
if "*" in ALLOWED_HOSTS and not DEBUG:
    raise ImproperlyConfigured(
        "ALLOWED_HOSTS='*' accepts any Host header; name the control plane's host names "
        "(comma-separated), or set DEBUG=1 for development"
    )
# BEHIND_TLS_PROXY=1: served over HTTPS by a proxy that terminates TLS and sets
# X-Forwarded-Proto (it must overwrite a client's own). Then cookies are Secure, HTTPS answers
# carry HSTS, and console pages asked over plain HTTP redirect to HTTPS; /api/ and /healthz do
# not, so that routers and probes inside the cluster keep calling the pods over HTTP.
BEHIND_TLS_PROXY = envbool("BEHIND_TLS_PROXY", False)
SILENCED_SYSTEM_CHECKS: list[str] = []  # each silenced check says why where it is added
if BEHIND_TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^api/", r"^healthz$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 365 * 86400, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    # Preloading is an operator's decision that browsers do not let go back on: off unless set,
    # and then `check --deploy` need not ask for it.
    SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        SILENCED_SYSTEM_CHECKS.append("security.W021")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "controlplane.tenants",
    "controlplane.endpoints",
    "controlplane.oncall",
    "controlplane.console",
    "controlplane.capacity",
    # The layer above the apps (selling, scaling, rollouts, benchmarks): its management
    # commands, and its Celery tasks (controlplane.tasks) for autodiscovery. No models.
    "controlplane",
]

MIDDLEWARE = [
    "controlplane.api.middleware.ApiErrorsMiddleware",  # outermost: every /api/ answer is JSON
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        **envdatabase("DATABASE_URL", f"sqlite:///{VAR_DIR / 'controlplane.sqlite3'}"),
        # Every request is one transaction; the API error handler rolls it back on any error.
        "ATOMIC_REQUESTS": True,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# A sale's statement that reads its endpoint is prepared once per connection (PREPARE); off
# behind a proxy that pools PostgreSQL connections per transaction.
DATABASE_PREPARED_STATEMENTS = envbool("DATABASE_PREPARED_STATEMENTS", True)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = envstr("STATIC_ROOT", "") or None  # only for collectstatic in images
# Serve static files from the apps' folders without collectstatic (embedded and tests alike).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/console/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# --- Console and sign-in security (CSP, CSRF cookie, throttling, passwords, /admin/) ----
# The Content-Security-Policy of every page (controlplane.console.security): scripts, styles and
# requests from this origin only, no inline script or style, no framing. Swagger UI needs its
# inline <style> and data: images, and only there.
CSP_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
CSP_EXCEPTIONS = {
    "/api/docs/": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
}
MIDDLEWARE.insert(1, "controlplane.console.security.ContentSecurityPolicyMiddleware")
# Script cannot read the CSRF token from the cookie: htmx sends it from <body hx-headers>.
CSRF_COOKIE_HTTPONLY = True
# Sign-in throttling (django-axes, on the console's and the admin's sign-in alike): after
# LOGIN_FAILURE_LIMIT failed sign-ins a username is locked, from every address (an address is
# recorded with each attempt; locking by address alone would lock out everyone behind one proxy),
# for LOGIN_LOCKOUT_HOURS or until `manage.py axes_reset_username NAME`. Failures and lock-outs
# are logged (logger "axes") and kept in the database (`manage.py axes_list_attempts`).
INSTALLED_APPS.append("axes")
MIDDLEWARE.append("axes.middleware.AxesMiddleware")  # last: it turns a lock-out into the 429 page
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: a locked-out username goes no further
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = envint("LOGIN_FAILURE_LIMIT", 10, minimum=1)
AXES_COOLOFF_TIME = envfloat("LOGIN_LOCKOUT_HOURS", 1.0, minimum=0.01)
AXES_LOCKOUT_PARAMETERS = ["username"]
# axes.W006 asks for ip_address among the lock-out parameters; by username alone, rotating
# addresses, user agents or cookies gains an attacker no tries, and another user signs in.
SILENCED_SYSTEM_CHECKS.append("axes.W006")
AXES_VERBOSE = False  # no banner on every manage.py command; lock-outs are still logged
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# Passwords of console users (`manage.py create_user`, password change) meet Django's rules.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": f"django.contrib.auth.password_validation.{name}"}
    for name in (
        "UserAttributeSimilarityValidator",
        "MinimumLengthValidator",
        "CommonPasswordValidator",
        "NumericPasswordValidator",
    )
]
# Django's admin site (/admin/) is served only when ADMIN_ENABLED is on (the embedded default
# keeps it off too: the console and the API are the interfaces).
ADMIN_ENABLED = envbool("ADMIN_ENABLED", False)
# --- end of console and sign-in security ----------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["controlplane.api.auth.BearerKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["controlplane.api.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "controlplane.api.pagination.PageNumberPagination",
    "DEFAULT_SCHEMA_CLASS": "controlplane.api.schema.AutoSchema",
    "EXCEPTION_HANDLER": "controlplane.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}

# JSON bodies nested deeper than this are refused with a 400 (controlplane.api.parsers).
API_MAX_JSON_DEPTH = envint("API_MAX_JSON_DEPTH", 64, minimum=1)

SPECTACULAR_SETTINGS = {
    "TITLE": "Inference control plane API",
    "DESCRIPTION": "Tenants, endpoints, GPU pools and capacity sold in model units (MU).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Capacity -------------------------------------------------------------------------------
# Work one replica of any model does per minute on its GPU type; the unit of the whole ledger.
MU_PER_REPLICA_MINUTE = envint("MU_PER_REPLICA_MINUTE", units.MU_PER_REPLICA_MINUTE, minimum=1)
# Sold GPUs may reach have x this factor (1.0 = never sell more than the fleet holds).
CAPACITY_OVERCOMMIT = envfloat("CAPACITY_OVERCOMMIT", 1.0, minimum=0.01)
# GPUs a tenant's endpoints may take at their minimum replicas, and at their maximum, each summed
# over its endpoints, unless an operator set the tenant's own gpu_quota: the fleet's GPUs (every
# pool's, summed, as they are when checked: controlplane.tenant_limits.gpu_quota), and no more than
# this when it is set. Unset (or blank): the fleet's.
TENANT_GPU_QUOTA_DEFAULT: int | None = (
    envint("TENANT_GPU_QUOTA_DEFAULT", 0, minimum=0)
    if envstr("TENANT_GPU_QUOTA_DEFAULT", "").strip()
    else None
)
# Minimum replicas beyond its reservations that a tenant may commit in a pool without an
# operator's allowance (controlplane.capacity.models.ProvisionedAllowance), in the pool's nodes:
# one node holds a warm replica of any model the pool places; more is capacity to sell.
PROVISIONED_ALLOWANCE_DEFAULT_NODES = envint("PROVISIONED_ALLOWANCE_DEFAULT_NODES", 1, minimum=0)
# Starting point of the vertical autoscaler for a new endpoint (concurrent requests per pod).
DEFAULT_TARGET_CONCURRENCY = envint("DEFAULT_TARGET_CONCURRENCY", 8, minimum=1)
# An API key's last-used time is written at most this often, to keep writes off the hot path.
API_KEY_LAST_USED_RESOLUTION_S = envint("API_KEY_LAST_USED_RESOLUTION_S", 60, minimum=0)
# Bounds on a tenant's API keys (controlplane.tenants.key_limits): active (not revoked) keys at
# once, and keys made in any hour, revoked ones included. Operators' keys are exempt.
API_KEYS_PER_TENANT_MAX = envint("API_KEYS_PER_TENANT_MAX", 100, minimum=1)
API_KEY_CREATIONS_PER_HOUR = envint("API_KEY_CREATIONS_PER_HOUR", 60, minimum=1)

# --- Benchmarks (model units) -----------------------------------------------------------------
# Where to measure: one engine URL for every model x GPU pair, or else a SIMULATED engine: "auto"
# (the embedded default) runs each pair's own simulated profile (ModelProfile.simulated_profile,
# else its GPU type's), a profile name runs that one for every pair, "" measures no simulation.
# Fits from a simulated engine say "simulated" in their engine field.
BENCHMARK_ENGINE_URL = envstr("BENCHMARK_ENGINE_URL", "")
# The fleet key (a mode-600 file): the credential pods answer to, sent by benchmarks that drive a
# pod (BENCHMARK_ENGINE_URL's or a cluster's); unset: pods without a key.
POD_KEY_FILE = envstr("POD_KEY_FILE", "")
BENCHMARK_SIMULATED_PROFILE = envstr("BENCHMARK_SIMULATED_PROFILE", "auto" if EMBEDDED else "")
# "virtual": the simulated engine's performance model runs in-process on a virtual clock, which
# the machine's load cannot bend (a 17-shape sweep in seconds, the same fit on a busy machine);
# "wall": a simulated engine pod over HTTP at BENCHMARK_SIMULATED_TIME_SCALE, timed by the wall
# clock (the whole path, and the machine's noise with it).
BENCHMARK_SIMULATED_CLOCK = envstr("BENCHMARK_SIMULATED_CLOCK", "virtual")
if BENCHMARK_SIMULATED_CLOCK not in ("virtual", "wall"):
    raise ImproperlyConfigured(
        f"BENCHMARK_SIMULATED_CLOCK={BENCHMARK_SIMULATED_CLOCK!r}: use 'virtual' or 'wall'"
    )
BENCHMARK_SIMULATED_TIME_SCALE = envfloat("BENCHMARK_SIMULATED_TIME_SCALE", 20.0, minimum=0.001)
BENCHMARK_ENGINE_VERSION = envstr("BENCHMARK_ENGINE_VERSION", "")  # a change makes every fit stale
BENCHMARK_MAX_AGE_S = envint("BENCHMARK_MAX_AGE_S", 7 * 86400, minimum=60)
BENCHMARK_MAX_HELDOUT_MAPE = envfloat("BENCHMARK_MAX_HELDOUT_MAPE", 0.10, minimum=0.0)
# A fit that prices any measured shape more than this below its measurement is refused: it would
# oversell those requests (the fit reweights such shapes first, capacity.fitting).
BENCHMARK_MAX_UNDERPRICE = envfloat("BENCHMARK_MAX_UNDERPRICE", 0.05, minimum=0.0)
# The latency objective a shape's rate must meet: p99 end to end within
# first token + per output token x its output length (TTFT and inter-token budgets).
BENCHMARK_SLO_FIRST_TOKEN_S = envfloat("BENCHMARK_SLO_FIRST_TOKEN_S", 5.0, minimum=0.001)
BENCHMARK_SLO_PER_OUTPUT_TOKEN_S = envfloat("BENCHMARK_SLO_PER_OUTPUT_TOKEN_S", 0.1, minimum=0.0001)
BENCHMARK_SHAPES = envstr("BENCHMARK_SHAPES", "")  # "16x1,128x16,..."; empty: the default grid
# Wall seconds a sweep may take: the first pass always runs whole, then no re-measure or second
# look starts that would end it later (0: only their share of the first pass bounds them).
BENCHMARK_MAX_WALL_S = envfloat("BENCHMARK_MAX_WALL_S", 0.0, minimum=0.0)
BENCHMARK_CLAIM_TTL_S = envint("BENCHMARK_CLAIM_TTL_S", 3600, minimum=60)  # a crashed worker's claim expires
# A failed or refused benchmark is retried after this, doubling per failure in a row, up to
# BENCHMARK_RETRY_MAX_S (60 s, 2 min, 4 min, ... 4 h).
BENCHMARK_RETRY_BASE_S = envint("BENCHMARK_RETRY_BASE_S", 60, minimum=1)
BENCHMARK_RETRY_MAX_S = envint("BENCHMARK_RETRY_MAX_S", 4 * 3600, minimum=1)
BENCHMARK_CHECK_INTERVAL_S = envfloat("BENCHMARK_CHECK_INTERVAL_S", 60.0, minimum=0.1)
# Without BENCHMARK_ENGINE_URL and with a cluster driver, a benchmark runs against a pod of its
# own: the deployment bench-{profile id}, declared by the autoscaler's pass while the benchmark
# holds its claim (gone with the claim). It runs BENCHMARK_POD_ENGINE: "sim" (the profile
# BENCHMARK_SIMULATED_PROFILE) or "vllm" (BENCHMARK_VLLM_MODEL, a path or hub id; the engine in
# the cluster's vLLM interpreter: the agent's --vllm-python, the image's; BENCHMARK_VLLM_ARGS
# added, e.g. "--max-num-seqs 16").
BENCHMARK_POD_ENGINE = envstr("BENCHMARK_POD_ENGINE", "sim")
if BENCHMARK_POD_ENGINE not in ("sim", "vllm"):
    raise ImproperlyConfigured(f"BENCHMARK_POD_ENGINE={BENCHMARK_POD_ENGINE!r}: use 'sim' or 'vllm'")
BENCHMARK_VLLM_MODEL = envstr("BENCHMARK_VLLM_MODEL", "")
BENCHMARK_VLLM_ARGS = envstr("BENCHMARK_VLLM_ARGS", "")
BENCHMARK_POD_READY_TIMEOUT_S = envfloat("BENCHMARK_POD_READY_TIMEOUT_S", 300.0, minimum=1.0)

# What endpoints' pods run: "sim" (the simulated engine for the profile's GPU type, no GPUs) or
# "vllm" (the profile's model; --tensor-parallel-size and the pod's nvidia.com/gpu limit are the
# profile's gpus_per_replica; ENDPOINT_VLLM_ARGS added, e.g. "--max-num-seqs 64").
ENDPOINT_POD_ENGINE = envstr("ENDPOINT_POD_ENGINE", "sim")
if ENDPOINT_POD_ENGINE not in ("sim", "vllm"):
    raise ImproperlyConfigured(f"ENDPOINT_POD_ENGINE={ENDPOINT_POD_ENGINE!r}: use 'sim' or 'vllm'")
ENDPOINT_VLLM_ARGS = envstr("ENDPOINT_VLLM_ARGS", "")
# Checked here against what a deployment may carry (the local agent refuses the rest), so that
# a flag off the list stops the start, named, rather than every apply.
for _name, _value in (
    ("BENCHMARK_VLLM_ARGS", BENCHMARK_VLLM_ARGS),
    ("ENDPOINT_VLLM_ARGS", ENDPOINT_VLLM_ARGS),
):
    try:
        pod_args.check("vllm", shlex.split(_value))
    except ValueError as _exc:
        raise ImproperlyConfigured(f"{_name}={_value!r}: {_exc}") from None

# --- Autoscaler and cluster -------------------------------------------------------------------
# Where endpoints' pods run: "local" (supervised processes of `python -m dataplane.cluster.agent`
# at CLUSTER_AGENT_URL; the embedded default), "kubernetes" (a Deployment per endpoint in
# KUBERNETES_NAMESPACE, through the API server of the cluster we run in, or of the current
# kubeconfig) or "none" (pods are registered through /api/v1/pods/ by someone else; the
# autoscaler still collects load and usage, decides nothing).
CLUSTER_DRIVER = envstr("CLUSTER_DRIVER", "local" if EMBEDDED else "none")
if CLUSTER_DRIVER not in ("none", "local", "kubernetes"):
    raise ImproperlyConfigured(f"CLUSTER_DRIVER={CLUSTER_DRIVER!r}: use 'none', 'local' or 'kubernetes'")
CLUSTER_AGENT_URL = envstr("CLUSTER_AGENT_URL", "http://127.0.0.1:8700")
# The file (mode 600) holding the token every call to the agent carries; the agent reads the
# same file (its --token-file). `make run` writes it under var/keys/.
CLUSTER_AGENT_TOKEN_FILE = envstr(
    "CLUSTER_AGENT_TOKEN_FILE", str(VAR_DIR / "keys" / "agent.token") if EMBEDDED else ""
)
# The Kubernetes driver: where the runtime pods run and from which images (their entrypoints
# start `python -m dataplane.runtime.pod`); RUNTIME_EVENTS_URL is where the pods' probers post
# hang events (empty: logged only), each deployment's pods with their endpoint's events
# credential, from a Secret of the deployment's own.
KUBERNETES_NAMESPACE = envstr("KUBERNETES_NAMESPACE", "mu-runtime")
RUNTIME_SIM_IMAGE = envstr("RUNTIME_SIM_IMAGE", "mu/runtime-sim:0.1.0")
RUNTIME_VLLM_IMAGE = envstr("RUNTIME_VLLM_IMAGE", "mu/runtime-vllm:0.1.0")
RUNTIME_IMAGE_PULL_POLICY = envstr("RUNTIME_IMAGE_PULL_POLICY", "IfNotPresent")
if RUNTIME_IMAGE_PULL_POLICY not in ("Always", "IfNotPresent", "Never"):
    raise ImproperlyConfigured(
        f"RUNTIME_IMAGE_PULL_POLICY={RUNTIME_IMAGE_PULL_POLICY!r}: use 'Always', 'IfNotPresent' or 'Never'"
    )
RUNTIME_EVENTS_URL = envstr("RUNTIME_EVENTS_URL", "")
# The Secret of that namespace whose `key` is the fleet key, each runtime pod's $VLLM_API_KEY:
# the pods answer only requests bearing it (the routers', benchmarks'). Empty: open pods.
RUNTIME_FLEET_KEY_SECRET = envstr("RUNTIME_FLEET_KEY_SECRET", "fleet-key")
# Local pods run the simulated engine at this speed-up (1.0: real time).
LOCAL_POD_TIME_SCALE = envfloat("LOCAL_POD_TIME_SCALE", 1.0, minimum=0.001)
AUTOSCALER_HORIZONTAL_INTERVAL_S = envfloat("AUTOSCALER_HORIZONTAL_INTERVAL_S", 5.0, minimum=0.5)
AUTOSCALER_VERTICAL_INTERVAL_S = envfloat("AUTOSCALER_VERTICAL_INTERVAL_S", 30.0, minimum=1.0)
POD_SYNC_INTERVAL_S = envfloat("POD_SYNC_INTERVAL_S", 1.0, minimum=0.2)
# A rollout's old pods take no new request this long before they go; a new version that is not
# ready within the deadline is rolled back; a canary not promoted within the hold is aborted.
ROLLOUT_DRAIN_S = envfloat("ROLLOUT_DRAIN_S", 10.0, minimum=0.0)
ROLLOUT_READY_DEADLINE_S = envfloat("ROLLOUT_READY_DEADLINE_S", 600.0, minimum=1.0)
ROLLOUT_MAX_HOLD_S = envfloat("ROLLOUT_MAX_HOLD_S", 3600.0, minimum=1.0)
# Router samples posted to the database (no Redis), once billed, and 5-second load buckets are
# kept this long.
ROUTER_SAMPLE_RETENTION_S = envint("ROUTER_SAMPLE_RETENTION_S", 900, minimum=400)
LOAD_BUCKET_RETENTION_S = envint("LOAD_BUCKET_RETENTION_S", 86400, minimum=400)
# The longest load history one endpoint's autoscaler settings may read at each decision (its
# windows, burst memory, idle grace): every pass loads it for every endpoint.
AUTOSCALER_MAX_HISTORY_S = envint("AUTOSCALER_MAX_HISTORY_S", 3600, minimum=400)
# Hours of usage per endpoint (/api/v1/usage/, the console's endpoint page) are kept this long.
USAGE_RETENTION_DAYS = envint("USAGE_RETENTION_DAYS", 400, minimum=8)
# Pools' per-minute capacity snapshots are kept for the capacity page's charts of up to a week
# (its first hour included), their hourly rollup for the forecast's four weeks and a day, and
# beyond for history (controlplane.capacity.snapshots).
CAPACITY_SNAPSHOT_RETENTION_DAYS = envint("CAPACITY_SNAPSHOT_RETENTION_DAYS", 8, minimum=8)
CAPACITY_HOUR_RETENTION_DAYS = envint("CAPACITY_HOUR_RETENTION_DAYS", 400, minimum=30)

# --- On-call paging (controlplane.oncall.paging) ----------------------------------------------
# Critical groups (and warning groups with ONCALL_PAGE_WARNINGS=1) POST Alertmanager webhook JSON
# to ONCALL_WEBHOOK_URL (empty: no paging); links in the pages point at ONCALL_CONSOLE_URL. A
# group with no repeat for ONCALL_RESOLVE_AFTER_S is resolved (and the webhook told).
ONCALL_WEBHOOK_URL = envstr("ONCALL_WEBHOOK_URL", "")
if ONCALL_WEBHOOK_URL and not ONCALL_WEBHOOK_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        f"ONCALL_WEBHOOK_URL={ONCALL_WEBHOOK_URL!r} must be an http:// or https:// URL"
    )
ONCALL_PAGE_WARNINGS = envbool("ONCALL_PAGE_WARNINGS", False)
ONCALL_CONSOLE_URL = envstr("ONCALL_CONSOLE_URL", "http://127.0.0.1:8000")
ONCALL_RESOLVE_AFTER_S = envint("ONCALL_RESOLVE_AFTER_S", 3600, minimum=60)
ONCALL_WEBHOOK_TIMEOUT_S = envfloat("ONCALL_WEBHOOK_TIMEOUT_S", 5.0, minimum=0.1)

# --- Celery ---------------------------------------------------------------------------------
REDIS_URL = envstr("REDIS_URL", "")
# The embedded default's broker is the Redis that `make run` starts on a unix socket under var/
# (kombu's filesystem transport could read a message before it was written, and the worker died
# of it: docs/embedded-stack.md has the measurements behind the choice).
CELERY_BROKER_URL = envstr(
    "CELERY_BROKER_URL", kombu_redis_url(REDIS_URL or f"unix://{VAR_DIR / 'redis.sock'}")
)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# With Redis the routing table is built once every ROUTING_TABLE_PUBLISH_INTERVAL_S seconds (or
# twice a build's time after it, when longer) and served from there
# (controlplane.endpoints.routing); a copy older than ROUTING_TABLE_STALE_AFTER_S is not served
# (its builder is down) and the view builds the table. 10,000 endpoints build in about 2.3 s.
ROUTING_TABLE_PUBLISH_INTERVAL_S = envfloat("ROUTING_TABLE_PUBLISH_INTERVAL_S", 1.0, minimum=0.1)
ROUTING_TABLE_STALE_AFTER_S = envfloat("ROUTING_TABLE_STALE_AFTER_S", 10.0, minimum=1.0)
# Task names are those each task was first registered under (controlplane.tasks keeps them).
CELERY_BEAT_SCHEDULE = {
    "record-capacity-snapshot": {
        "task": "controlplane.capacity.tasks.record_capacity_snapshot",
        "schedule": envfloat("CAPACITY_SNAPSHOT_INTERVAL_S", 60.0, minimum=1.0),
    },
    "collect-load": {
        "task": "controlplane.endpoints.tasks.collect_load",
        "schedule": AUTOSCALER_HORIZONTAL_INTERVAL_S,
        "options": {"expires": AUTOSCALER_HORIZONTAL_INTERVAL_S},  # the next tick does what it would
    },
    "roll-up-timeline": {
        "task": "controlplane.endpoints.tasks.roll_up_timeline",
        "schedule": 30.0,
        "options": {"expires": 30.0},  # the next tick does what it would
    },
    "autoscale-horizontal": {
        "task": "controlplane.endpoints.tasks.autoscale_horizontal",
        "schedule": AUTOSCALER_HORIZONTAL_INTERVAL_S,
        "options": {"expires": AUTOSCALER_HORIZONTAL_INTERVAL_S},  # a late tick is stale: drop it
    },
    "autoscale-vertical": {
        "task": "controlplane.endpoints.tasks.autoscale_vertical",
        "schedule": AUTOSCALER_VERTICAL_INTERVAL_S,
        "options": {"expires": AUTOSCALER_VERTICAL_INTERVAL_S},
    },
    "publish-routing-table": {
        "task": "controlplane.endpoints.tasks.publish_routing_table",
        "schedule": ROUTING_TABLE_PUBLISH_INTERVAL_S,
        "options": {"expires": ROUTING_TABLE_PUBLISH_INTERVAL_S},
    },
    "sync-pods": {
        "task": "controlplane.endpoints.tasks.sync_pods",
        "schedule": POD_SYNC_INTERVAL_S,
        "options": {"expires": POD_SYNC_INTERVAL_S},
    },
    "benchmark-due-profiles": {
        "task": "controlplane.capacity.tasks.benchmark_due_profiles",
        "schedule": BENCHMARK_CHECK_INTERVAL_S,
    },
    "oncall-sweep": {
        "task": "controlplane.oncall.tasks.oncall_sweep",
        "schedule": envfloat("ONCALL_SWEEP_INTERVAL_S", 15.0, minimum=1.0),
        "options": {"expires": 60.0},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
}
