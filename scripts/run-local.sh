#!/usr/bin/env bash
# `make run`: the whole stack on one machine, embedded (SQLite, filesystem broker, no Redis):
#   control plane (API, console)  http://127.0.0.1:8000   runserver, in the foreground
#   Celery worker + beat          var/celery.log          the autoscaler's passes, benchmarks
#   cluster agent                 var/agent.log           local pods; their logs in var/pods/
#   router                        http://127.0.0.1:8080   var/router.log
# Ctrl-C stops everything (the agent stops its pods).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
# The embedded default for development: the debug pages on, the public key (no DATABASE_URL).
export DEBUG=${DEBUG:-1}
CP=http://127.0.0.1:8000
mkdir -p var/broker var/broker-processed var/pods var/keys
"$BIN/python" manage.py migrate --noinput -v0
"$BIN/python" manage.py load_demo --write-keys var/keys
if [ ! -s var/keys/operator.key ]; then  # a database from before keys were written
    "$BIN/python" manage.py create_operator_key local-stack | tail -n 1 >var/keys/operator.key
    chmod 600 var/keys/operator.key
fi
# The operator key reaches the agent and the router in a file, never on a command line (ps).
KEY_FILE=var/keys/operator.key
pids=()
cleanup() {
    trap - EXIT INT TERM
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true  # the agent stops its pods before it exits
}
trap cleanup EXIT INT TERM
"$BIN/celery" -A controlplane worker --beat --pool=threads --concurrency=4 --loglevel=INFO \
    --schedule=var/celerybeat-schedule >var/celery.log 2>&1 &
pids+=($!)
"$BIN/python" -m dataplane.cluster.agent --listen 127.0.0.1:8700 --log-dir var/pods --warm-pool 2 \
    --control-plane "$CP" --key-file "$KEY_FILE" >var/agent.log 2>&1 &
pids+=($!)
"$BIN/python" -m dataplane.router --listen 127.0.0.1:8080 \
    --control-plane "$CP" --key-file "$KEY_FILE" --log-level info >var/router.log 2>&1 &
pids+=($!)
echo "Router on http://127.0.0.1:8080 (var/router.log); pods: var/agent.log, var/pods/; Celery: var/celery.log"
echo "Drive traffic from another shell: make load"
# In the background too, so that a signal to this script is handled at once (bash runs a trap
# only when its foreground command returns; `wait` returns on a signal).
"$BIN/python" manage.py runserver 127.0.0.1:8000 --noreload &
pids+=($!)
wait "${pids[-1]}"
