#!/usr/bin/env bash
# What the shared (leased) limiter costs, side by side in one run, rounds interleaved so all see
# the same machine, on nginx pods that answer a 50+50-token completion at once (only the proxy
# costs). Three routers on the same pods, wrk on CPU 1 (as ../shared/bench/router-peers.sh):
#   inproc   ours, --workers WORKERS, the in-process GCRA on every request (a reservation of
#            1e12 MU/min: checked, never denying)
#   leased   the same with --redis on a redis-server of this script: the reservation leased
#            across its workers, renewed in the background
#   vllm-router  the Rust vllm-router 0.1.17 (power_of_two), no limiter
# Redis commands per request: INFO commandstats of that redis-server over each round / requests,
# the lease script's (EVALSHA and TIME, GET, SET inside it) and all (the per-second metering
# rows, INCR/EXPIRE/HINCRBYFLOAT, included).
# Env: DURATION (s, 5), CONNS (64), ROUNDS (3), WORKERS (2), PY, ROUTER_PEERS_CACHE.
# Figures: leased/inproc req/s >= 0.95; limiter Redis commands per request <= 0.01;
# leased/vllm-router req/s >= 1.0.
# --smoke: one round of 1 s, 8 connections
#   (tests/test_bench_smoke.py runs it): does it still run, not what it gives.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --smoke ]]; then DURATION=${DURATION:-1} CONNS=${CONNS:-8} ROUNDS=${ROUNDS:-1}; fi
PY=${PY:-$(pwd)/.venv/bin/python}
DURATION=${DURATION:-5} CONNS=${CONNS:-64} ROUNDS=${ROUNDS:-3} WORKERS=${WORKERS:-2}
CACHE=${ROUTER_PEERS_CACHE:-$HOME/.cache/router-peers}
for tool in wrk nginx redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install -y wrk nginx-light redis-server)"; exit 2; }
done
if [[ ! -x $CACHE/venv/bin/vllm-router ]]; then  # as router-peers.sh installs it, in the same cache
  python3 -m venv "$CACHE/venv" && "$CACHE/venv/bin/pip" install -q vllm-router==0.1.17 >/dev/null
fi
WORK=$(mktemp -d /tmp/router-limiter.XXXXXX)
REDIS_PORT=18479
pids=()
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done
            [[ -f $WORK/nginx.pid ]] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
            rm -rf "$WORK"; }
trap cleanup EXIT

source "$(dirname "$0")/nginx_pods.sh"
start_nginx_pods "$WORK" 8192 18401 18402 18411 18412
BACKENDS=http://127.0.0.1:18401,http://127.0.0.1:18402
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
pids+=($!)
start_ours() {  # port, extra flags
  PYTHONPATH=$(pwd) "$PY" -m dataplane.router --listen "127.0.0.1:$1" --backends "$BACKENDS" \
    --policy p2c-mu --rate-limit-mu-per-min 1e12 --workers "$WORKERS" "${@:2}" >"$WORK/router-$1.log" 2>&1 &
  pids+=($!)
}
start_ours 18480
start_ours 18490 --redis "redis://127.0.0.1:$REDIS_PORT/0"
"$CACHE/venv/bin/vllm-router" --host 127.0.0.1 --port 18495 --policy power_of_two --log-level error \
  --worker-urls http://127.0.0.1:18401 http://127.0.0.1:18402 >"$WORK/vllm-router.log" 2>&1 &
pids+=($!)
for port in 18480 18490 18495; do
  for _ in $(seq 1 120); do
    curl -sf -o /dev/null -XPOST -H 'content-type: application/json' -d '{"model":"m","prompt":"hi","max_tokens":1}' \
      "http://127.0.0.1:$port/v1/completions" && break; sleep 0.5; done
done
cat >"$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"The quick brown fox jumps over the lazy dog and keeps on running through the field until the sun sets behind the hills","max_tokens":50}'
wrk.headers["Content-Type"] = "application/json"
LUA
names=(inproc leased vllm-router); ports=(18480 18490 18495)
# calls of the commands whose names match $1 (the lease script's: evalsha and, inside it, time,
# get, set; all: every command but INFO, which this script sends)
commands() { redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' \
  | awk -F'[:=,]' -v re="^cmdstat_($1)\$" '$1 ~ re && $1 != "cmdstat_info" {s += $3} END {print s + 0}'; }
LEASE_CMDS='evalsha|time|get|set'
ALL_CMDS='[a-z_]+'
echo "load before: $(uptime)"
echo "router round req_per_s p99 lease_redis_cmds_per_req all_redis_cmds_per_req non2xx_or_errors"
for r in $(seq 1 "$ROUNDS"); do
  for i in "${!ports[@]}"; do
    l0=$(commands "$LEASE_CMDS"); c0=$(commands "$ALL_CMDS")
    out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$WORK/post.lua" --latency \
      "http://127.0.0.1:${ports[$i]}/v1/completions" 2>&1)
    l1=$(commands "$LEASE_CMDS"); c1=$(commands "$ALL_CMDS")
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    n=$(awk '/requests in/ {print $1}' <<<"$out")
    p99=$(awk '$1=="99%" {print $2}' <<<"$out")
    per=$(awk -v l=$((l1 - l0)) -v c=$((c1 - c0)) -v n="$n" 'BEGIN {printf "%.5f %.5f", n ? l / n : 0, n ? c / n : 0}')
    bad=$(awk '/Non-2xx|Socket errors/ {s=s $0 " "} END {print (s=="" ? 0 : s)}' <<<"$out" | tr -s ' ' '_')
    echo "${names[$i]} $r $rps $p99 $per $bad"
  done
done | tee "$WORK/rows"
echo "--- redis commandstats over the run (the lease script: evalsha, and time/get/set inside it;"
echo "    the per-second metering rows: incr/expire/hincrbyfloat)"
redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' | grep '^cmdstat_' | cut -d, -f1
echo "--- medians"
median() { sort -n | awk '{r[NR]=$1} END {print r[int((NR+1)/2)]}'; }
for n in "${names[@]}"; do
  echo "$n median_req_per_s $(awk -v n="$n" '$1==n {print $3}' "$WORK/rows" | median)"
done | tee "$WORK/med"
echo "leased median lease_redis_cmds_per_req $(awk '$1=="leased" {print $5}' "$WORK/rows" | median) (goal <= 0.01)"
echo "leased median all_redis_cmds_per_req $(awk '$1=="leased" {print $6}' "$WORK/rows" | median) (metering rows included)"
awk '{m[$1]=$3} END {
  printf "ratio leased/inproc req_per_s %.3f (goal >= 0.95)\n", m["leased"] / m["inproc"]
  printf "ratio leased/vllm-router req_per_s %.3f (goal >= 1.0)\n", m["leased"] / m["vllm-router"]
}' "$WORK/med"
echo "load after: $(uptime)"
