#!/usr/bin/env bash
# The router's figures for the README's capacity model, in one run on loopback:
#   1. CPU per request at saturation (wrk, CONNS connections, one router worker, the in-process
#      limiter on every request): per-core throughput = 1e6 / cpu_us_per_req; CPU, not req/s,
#      because a busy shared machine slows req/s but hardly what a request costs;
#   2. latency at half the rate measured in 1: wrk's connections each wait between requests
#      (a Lua delay) so the offered rate is about half; p50/p99 through the router and, at the
#      same pacing, straight to one nginx pod: the difference is what the router adds.
# Backends: bench/nginx_pods.sh's vLLM-shaped JSON pods. Env: DURATION (s, 10), CONNS (64), PY.
# --smoke: 8 connections for 1 s (tests/test_bench_smoke.py runs it): does it still run, not what it gives.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --smoke ]]; then DURATION=${DURATION:-1} CONNS=${CONNS:-8}; fi
PY=${PY:-$(pwd)/.venv/bin/python}
DURATION=${DURATION:-10} CONNS=${CONNS:-64}
command -v wrk >/dev/null && command -v nginx >/dev/null || { echo "needs wrk and nginx"; exit 2; }
WORK=$(mktemp -d /tmp/router-capacity.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done
            [[ -f $WORK/nginx.pid ]] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
            rm -rf "$WORK"; }
trap cleanup EXIT
source bench/nginx_pods.sh
start_nginx_pods "$WORK" 8192 18401 18402 18411 18412
PYTHONPATH=$(pwd) "$PY" -m dataplane.router --listen 127.0.0.1:18490 \
  --backends http://127.0.0.1:18401,http://127.0.0.1:18402 --policy p2c-mu \
  --rate-limit-mu-per-min 1e12 --workers 1 >"$WORK/router.log" 2>&1 &
pids+=($!); router=$!
for _ in $(seq 1 120); do curl -sf -o /dev/null http://127.0.0.1:18490/health && break; sleep 0.5; done
cat >"$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"The quick brown fox jumps over the lazy dog and keeps on running","max_tokens":50}'
wrk.headers["Content-Type"] = "application/json"
LUA
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
field() { awk -v k="$1" '$1==k {print $2}'; }
to_ms() { awk '{v=$1; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; printf "%.3f", v}'; }
echo "load before: $(uptime)"
c0=$(ticks "$router")
out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$WORK/post.lua" --latency http://127.0.0.1:18490/v1/completions 2>&1)
c1=$(ticks "$router")
n=$(awk '/requests in/ {print $1}' <<<"$out")
max=$(awk '/Requests\/sec/ {printf "%.0f", $2}' <<<"$out")
cpu_us=$(awk -v t=$((c1 - c0)) -v n="$n" 'BEGIN {printf "%.0f", t * 10000 / n}')
echo "saturation: req_per_s $max cpu_us_per_req $cpu_us per_core_req_per_s $((1000000 / cpu_us))"
# half the measured rate: CONNS connections, each waiting d ms after its answer
half=$((max / 2)); d=$(awk -v c="$CONNS" -v r="$half" 'BEGIN {printf "%d", c * 1000 / r}')
cat "$WORK/post.lua" >"$WORK/paced.lua"; echo "function delay() return $d end" >>"$WORK/paced.lua"
echo "target half rate $half req/s: each of $CONNS connections waits $d ms between requests"
echo "path req_per_s p50_ms p99_ms"
for path in router direct; do
  port=18490; [[ $path == direct ]] && port=18401
  out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$WORK/paced.lua" --latency "http://127.0.0.1:$port/v1/completions" 2>&1)
  echo "$path $(awk '/Requests\/sec/ {printf "%.0f", $2}' <<<"$out") $(field 50% <<<"$out" | to_ms) $(field 99% <<<"$out" | to_ms)"
done
echo "load after: $(uptime)"
