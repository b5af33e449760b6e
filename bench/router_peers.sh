#!/usr/bin/env bash
# Proxy speed of our router against HAProxy and the Rust vllm-router (/work/shared/bench/router-peers.sh
# or bench/router-peers.sh next to this file). Our router runs with p2c-mu and the in-process GCRA on
# the hot path: --rate-limit-mu-per-min 1e12 is a static reservation so generous it never denies, so
# every request pays for the limiter check without being throttled.
# Env: DURATION (default 5), ROUNDS (default 3), WORKERS (default 2), PEERS (path of router-peers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${PEERS:-/work/shared/bench/router-peers.sh}
PY=${PY:-$(pwd)/.venv/bin/python}
WORKERS=${WORKERS:-2}
echo "load before: $(uptime)"
DURATION=${DURATION:-5} ROUNDS=${ROUNDS:-3} bash "$PEERS" \
  "$PY -m dataplane.router --listen 127.0.0.1:{port} --backends {backends} --policy p2c-mu --rate-limit-mu-per-min 1e12 --workers $WORKERS"
echo "load after: $(uptime)"
