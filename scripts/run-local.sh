#!/usr/bin/env bash
# `make run`: the whole stack on one machine, embedded (SQLite; a private Redis as the broker):
#   Redis                         var/redis.sock          the broker, limiter and metering
#   control plane (API, console)  http://127.0.0.1:8000   var/controlplane.log
#   Celery worker + beat          var/celery.log          the autoscaler's passes, benchmarks
#   cluster agent                 var/agent.log           local pods; their logs in var/pods/
#   router                        http://127.0.0.1:8080   var/router.log
# The terminal gets one line per process started, the URLs and where the keys are; every access
# line (the stack polls itself: routing table, load samples) goes to the logs. The last run's
# logs are kept (var/*.log.1 .. .5, var/pods.1 ..). A process that dies is started again (with a
# backoff) and shows on the console's on-call page. Ctrl-C, or SIGTERM to this script or to the
# `make` that started it, stops everything (the agent stops its pods).
# CONTROLPLANE_VAR_DIR, CP_PORT, ROUTER_PORT, AGENT_PORT and WARM_POOL move it (tests run a
# second stack beside yours that way).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
# Everything the stack writes (database, broker, logs, keys, pods' logs, spool) is this user's
# alone: files 600, folders 700. DEBUG stays off (no debug page for anyone; `DEBUG=1 make run`
# turns it on for a developer) and the secret key is the one made once under var/ (settings.py).
umask 077
export CONTROLPLANE_VAR_DIR=${CONTROLPLANE_VAR_DIR:-$PWD/var}
VAR=$CONTROLPLANE_VAR_DIR
CP_PORT=${CP_PORT:-8000}
ROUTER_PORT=${ROUTER_PORT:-8080}
AGENT_PORT=${AGENT_PORT:-8700}
# Who started us (make, a shell): when it is gone (SIGTERM to make stops make alone; it does
# not pass the signal on), so are we.
PARENT=$PPID
# Ctrl-C while the database is made is a requested stop too: no error from make.
trap 'echo "Stopped."; exit 0' INT TERM HUP
REDIS_SERVER=$(command -v redis-server || true)
[ -n "$REDIS_SERVER" ] || { echo "no redis-server: apt-get install redis-server (make run does)"; exit 1; }
mkdir -p "$VAR"
chmod -R go-rwx "$VAR"  # a var/ an earlier run left readable to others
bash scripts/rotate-logs.sh "$VAR"
mkdir -p "$VAR/pods" "$VAR/keys"
"$BIN/python" manage.py migrate --noinput -v0 >>"$VAR/controlplane.log" 2>&1 \
    || { tail -n 20 "$VAR/controlplane.log"; exit 1; }
"$BIN/python" manage.py load_demo --write-keys "$VAR/keys" | sed '/already loaded/d'
if [ ! -s "$VAR/keys/operator.key" ]; then  # a database from before keys were written
    "$BIN/python" manage.py create_operator_key local-stack | tail -n 1 >"$VAR/keys/operator.key"
    chmod 600 "$VAR/keys/operator.key"
fi
# The operator key reaches the agent and the router in a file, never on a command line (ps).
KEY_FILE=$VAR/keys/operator.key
# The fleet key: pods answer only requests bearing it (the router's, their probers'); the agent
# gives it to pods in their environment, the router sends it.
export POD_KEY_FILE=$VAR/keys/fleet.key  # the control plane's benchmarks send it too
[ -s "$POD_KEY_FILE" ] || "$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$POD_KEY_FILE"
# Every call to the cluster agent carries this token; the agent and the control plane's local
# driver read it from this file (mode 600, else the agent refuses it). A new one each run.
export CLUSTER_AGENT_TOKEN_FILE=$VAR/keys/agent.token
rm -f "$CLUSTER_AGENT_TOKEN_FILE"  # so that the new one is made mode 600 whatever the old was
"$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$CLUSTER_AGENT_TOKEN_FILE"
# From here a Python supervisor (controlplane/localstack/supervisor.py) runs the stack: Redis on a
# unix socket under var/ (the broker), the Celery worker + beat, the agent, the router and the
# control plane, one terminal line each; a process that dies is started again with a capped
# backoff, its log's end printed and recorded as an on-call event. exec: make's signals (and
# Ctrl-C's) reach it directly, and its exit status (0 on a requested stop) is make's.
exec "$BIN/python" -m controlplane.localstack.supervisor --bin "$BIN" --var "$VAR" --parent "$PARENT" \
    --key-file "$KEY_FILE" --agent-token-file "$CLUSTER_AGENT_TOKEN_FILE" --pod-key-file "$POD_KEY_FILE" \
    ${VLLM_PYTHON:+--vllm-python "$VLLM_PYTHON"} --cp-port "$CP_PORT" --router-port "$ROUTER_PORT" --agent-port "$AGENT_PORT" \
    --warm-pool "${WARM_POOL:-2}" --redis-server "$REDIS_SERVER"
