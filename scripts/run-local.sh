#!/usr/bin/env bash
# `make run`: the whole stack on one machine, embedded (SQLite, filesystem broker, no Redis):
#   control plane (API, console)  http://127.0.0.1:8000   var/controlplane.log
#   Celery worker + beat          var/celery.log          the autoscaler's passes, benchmarks
#   cluster agent                 var/agent.log           local pods; their logs in var/pods/
#   router                        http://127.0.0.1:8080   var/router.log
# The terminal gets one line per process started, the URLs and where the keys are; every access
# line (the stack polls itself: routing table, load samples) goes to the logs. The last run's
# logs are kept (var/*.log.1 .. .5, var/pods.1 ..). Ctrl-C, or SIGTERM to this script or to the
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
CP=http://127.0.0.1:$CP_PORT
export CLUSTER_AGENT_URL=http://127.0.0.1:$AGENT_PORT  # where the worker's passes reach the agent
# Who started us (make, a shell): when it is gone (SIGTERM to make stops make alone; it does
# not pass the signal on), so are we.
PARENT=$PPID
mkdir -p "$VAR"
chmod -R go-rwx "$VAR"  # a var/ an earlier run left readable to others
bash scripts/rotate-logs.sh "$VAR"
mkdir -p "$VAR/broker" "$VAR/broker-processed" "$VAR/pods" "$VAR/keys"
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
pids=()
declare -A logs  # pid -> its log, to show when it dies
cleanup() {
    trap - EXIT INT TERM HUP
    echo "Stopping the stack (${#pids[@]} processes; the agent stops its pods)..."
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true  # the agent stops its pods before it exits
    echo "Stopped. Logs: $VAR/*.log (the previous run's: *.log.1)"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
started() {  # started NAME LOG [URL]: the one terminal line per process
    logs[${pids[-1]}]=$2
    printf '  started %-14s pid %-7s %s%s\n' "$1" "${pids[-1]}" "${3:+$3  }" "log $2"
}
"$BIN/celery" -A controlplane worker --beat --pool=threads --concurrency=4 --loglevel=INFO \
    --schedule="$VAR/celerybeat-schedule" >"$VAR/celery.log" 2>&1 &
pids+=($!)
started "celery" "$VAR/celery.log"
"$BIN/python" -m dataplane.cluster.agent --listen "127.0.0.1:$AGENT_PORT" --log-dir "$VAR/pods" \
    --warm-pool "${WARM_POOL:-2}" --control-plane "$CP" --key-file "$KEY_FILE" --token-file "$CLUSTER_AGENT_TOKEN_FILE" \
    --pod-key-file "$POD_KEY_FILE" ${VLLM_PYTHON:+--vllm-python "$VLLM_PYTHON"} >"$VAR/agent.log" 2>&1 &
pids+=($!)
started "cluster agent" "$VAR/agent.log" "http://127.0.0.1:$AGENT_PORT"
# Its metered seconds wait in var/router-spool/ until the control plane takes them: a router
# stopped while the control plane is down sends them at its next start.
"$BIN/python" -m dataplane.router --listen "127.0.0.1:$ROUTER_PORT" --spool-dir "$VAR/router-spool" \
    --control-plane "$CP" --key-file "$KEY_FILE" --pod-key-file "$POD_KEY_FILE" --log-level info \
    >"$VAR/router.log" 2>&1 &
pids+=($!)
started "router" "$VAR/router.log" "http://127.0.0.1:$ROUTER_PORT"
# In the background too, so that a signal to this script is handled at once (bash runs a trap
# only when its foreground command returns; `wait` returns on a signal). Its access lines (most
# of them the stack polling itself) go to its log, not to the terminal.
"$BIN/python" manage.py runserver "127.0.0.1:$CP_PORT" --noreload >"$VAR/controlplane.log" 2>&1 &
pids+=($!)
started "control plane" "$VAR/controlplane.log" "$CP"
keys=$(cd "$VAR/keys" && ls -- *.key 2>/dev/null | grep -vx fleet.key | tr '\n' ' ')  # fleet.key: no API key
echo "Console:  $CP/console/   (users: README.md, 'The console')"
echo "API:      $CP/api/v1/    (docs $CP/api/docs/)"
echo "Router:   http://127.0.0.1:$ROUTER_PORT/v1/   (OpenAI-compatible)"
echo "API keys: $VAR/keys/   ($keys)"
echo "Drive traffic from another shell: make load. Stop: Ctrl-C."
while true; do
    for pid in "${pids[@]}"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "pid $pid exited; the end of ${logs[$pid]}:" >&2
            tail -n 15 "${logs[$pid]}" >&2 || true
            exit 1
        fi
    done
    # Orphaned: our parent exited and we were handed to init (or a subreaper). Asking for our
    # parent now, not `kill -0 $PARENT`, which a dead parent's unreaped zombie still answers.
    [ "$(ps -o ppid= -p $$ | tr -d ' ')" = "$PARENT" ] || exit 143
    sleep 1 &
    wait $! || true
done
