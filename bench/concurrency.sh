#!/usr/bin/env bash
# Holds N concurrent slow streaming requests through the router (default 8000): each is a client
# socket and an upstream socket for ~STREAM_S seconds. Backend: bench/slow_backend.py on 127.0.0.1
# (2 processes), load: wrk with N connections posting stream=true. Prints wrk's totals and errors,
# the router's peak in-flight requests (sampled from /metrics) and its peak RSS.
# Env: CONNS (8000), DURATION (s, 40), EVENTS (10), INTERVAL (s, 1.0), WORKERS (router processes, 1).
# --smoke: 50 streams for 2 s (tests/test_bench_smoke.py runs it): does it still run, not what it gives.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --smoke ]]; then
  CONNS=${CONNS:-50} DURATION=${DURATION:-2} EVENTS=${EVENTS:-2} INTERVAL=${INTERVAL:-0.2}
fi
PY=${PY:-$(pwd)/.venv/bin/python}
CONNS=${CONNS:-8000} DURATION=${DURATION:-40} EVENTS=${EVENTS:-10} INTERVAL=${INTERVAL:-1.0}
WORKERS=${WORKERS:-1}
command -v wrk >/dev/null || { echo "needs wrk (apt-get install -y wrk)"; exit 2; }
ulimit -n "$(ulimit -Hn)"
WORK=$(mktemp -d /tmp/router-conc.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
for port in 18401 18402; do
  "$PY" bench/slow_backend.py --port $port --events "$EVENTS" --interval "$INTERVAL" &
  pids+=($!)
done
"$PY" -m dataplane.router --listen 127.0.0.1:18499 --backends http://127.0.0.1:18401,http://127.0.0.1:18402 \
  --policy p2c-mu --rate-limit-mu-per-min 1e12 --workers "$WORKERS" --upstream-connect-timeout-s 10 \
  >"$WORK/router.log" 2>&1 &
ROUTER=$!; pids+=($ROUTER)
for _ in $(seq 1 60); do curl -sf -o /dev/null http://127.0.0.1:18499/health && break; sleep 0.5; done
cat >"$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"Tell me a long story about a fox","max_tokens":10,"stream":true}'
wrk.headers["Content-Type"] = "application/json"
LUA
echo "load before: $(uptime)"
( peak=0; rss=0
  for _ in $(seq 1 $((DURATION * 2 + 20))); do
    n=$(curl -s -m 2 http://127.0.0.1:18499/metrics | awk '/^router_inflight_requests\{/ {s+=$2} END {print s+0}')
    (( n > peak )) && peak=$n
    r=$(ps -o rss= --ppid "$ROUTER" -p "$ROUTER" 2>/dev/null | awk '{s+=$1} END {print s+0}')
    (( r > rss )) && rss=$r
    echo "$peak $rss" >"$WORK/peak"; sleep 0.5
  done ) &
pids+=($!)
wrk -t1 -c"$CONNS" -d"${DURATION}s" --timeout 60s -s "$WORK/post.lua" --latency \
  http://127.0.0.1:18499/v1/completions | tee "$WORK/wrk.out"
read -r peak rss <"$WORK/peak"
echo "router peak in-flight (one worker's /metrics): $peak; router peak RSS: $((rss / 1024)) MiB"
echo "router log (errors):"; grep -ci "error\|traceback" "$WORK/router.log" || true
echo "load after: $(uptime)"
