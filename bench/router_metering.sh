#!/usr/bin/env bash
# What exact metering costs: requests/s of this tree's router against the router before it
# (BASE_REF, default f602ef5: main before exact metering, checked out in a temporary git worktree),
# side by side in one run, rounds interleaved so both see the same machine. Two workloads on nginx
# backends that answer at once (so only the proxy costs):
#   json    a completion of 50 tokens with usage (ours holds it to send x-mu-cost);
#   stream  "stream": true, 16 token events + the usage chunk + [DONE] in vLLM's compact JSON
#           (ours asks for usage, reads every event, drops the usage chunk).
# Both routers: p2c-mu, the in-process GCRA (--rate-limit-mu-per-min 1e12 never denies), WORKERS
# processes. Env: DURATION (s, 5), CONNS (64), ROUNDS (3), WORKERS (1), BASE_REF, PY.
# Prints one row per round, workload and router (requests/s, p99, the router's CPU per request),
# then medians and the ratios ours/base. On a shared, busy machine requests/s swing with the
# neighbours; the CPU a request costs the router does not, and is the steadier ratio.
# --smoke: one round of 1 s, 8 connections
#   (tests/test_bench_smoke.py runs it): does it still run, not what it gives.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --smoke ]]; then DURATION=${DURATION:-1} CONNS=${CONNS:-8} ROUNDS=${ROUNDS:-1}; fi
PY=${PY:-$(pwd)/.venv/bin/python}
BASE_REF=${BASE_REF:-f602ef5}
DURATION=${DURATION:-5} CONNS=${CONNS:-64} ROUNDS=${ROUNDS:-3} WORKERS=${WORKERS:-1}
command -v wrk >/dev/null && command -v nginx >/dev/null || { echo "needs wrk and nginx (apt-get install -y wrk nginx-light)"; exit 2; }
WORK=$(mktemp -d /tmp/router-metering.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done
            [[ -f $WORK/nginx.pid ]] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
            git worktree remove --force "$WORK/base" >/dev/null 2>&1 || true
            rm -rf "$WORK"; }
trap cleanup EXIT
git worktree add --detach -q "$WORK/base" "$BASE_REF"

source "$(dirname "$0")/nginx_pods.sh"
start_nginx_pods "$WORK" 8192 18301 18302 18311 18312

declare -A router_pid
start_router() {  # tree port backends
  (cd "$1" && PYTHONPATH="$1" exec "$PY" -m dataplane.router --listen "127.0.0.1:$2" --backends "$3" \
     --policy p2c-mu --rate-limit-mu-per-min 1e12 --workers "$WORKERS") >"$WORK/router-$2.log" 2>&1 &
  pids+=($!); router_pid[$2]=$!
}
# CPU seconds x 100 (clock ticks) a router and its worker processes have used: a busy machine
# slows both routers' requests/s, but not the CPU each request costs
cpu_ticks() { local t=0 p
  for p in "$1" $(pgrep -P "$1" || true); do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"; }
JSON_BACKENDS=http://127.0.0.1:18301,http://127.0.0.1:18302
SSE_BACKENDS=http://127.0.0.1:18311,http://127.0.0.1:18312
start_router "$WORK/base" 18380 "$JSON_BACKENDS"; start_router "$(pwd)" 18390 "$JSON_BACKENDS"
start_router "$WORK/base" 18381 "$SSE_BACKENDS"; start_router "$(pwd)" 18391 "$SSE_BACKENDS"
for port in 18380 18390 18381 18391; do
  for _ in $(seq 1 120); do curl -sf -o /dev/null "http://127.0.0.1:$port/health" && break; sleep 0.5; done
done
for w in json stream; do
  stream=false; [[ $w == stream ]] && stream=true
  cat >"$WORK/$w.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"The quick brown fox jumps over the lazy dog and keeps on running","max_tokens":50,"stream":$stream}'
wrk.headers["Content-Type"] = "application/json"
LUA
done
# what each router's client gets, once: ours drops the usage chunk it asked for, adds x-mu-cost
curl -s -D - -o /dev/null -XPOST -d '{"model":"m","prompt":"hi"}' http://127.0.0.1:18390/v1/completions \
  | grep -i '^x-mu-cost' || { echo "ours sent no x-mu-cost"; exit 1; }
echo "load before: $(uptime)"
echo "workload router round req_per_s p99_ms cpu_us_per_req non2xx_or_errors"
for r in $(seq 1 "$ROUNDS"); do
  for w in json stream; do
    for who in base ours; do
      port=18380; [[ $w == stream ]] && port=$((port + 1)); [[ $who == ours ]] && port=$((port + 10))
      c0=$(cpu_ticks "${router_pid[$port]}")
      out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$WORK/$w.lua" --latency "http://127.0.0.1:$port/v1/completions" 2>&1)
      c1=$(cpu_ticks "${router_pid[$port]}")
      rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
      n=$(awk '/requests in/ {print $1}' <<<"$out")
      cpu=$(awk -v t=$((c1 - c0)) -v n="$n" 'BEGIN {printf "%.0f", n ? t * 10000 / n : 0}')
      p99=$(awk '$1=="99%" {print $2}' <<<"$out")
      bad=$(awk '/Non-2xx|Socket errors/ {s=s $0 " "} END {print (s=="" ? 0 : s)}' <<<"$out" | tr -s ' ' '_')
      echo "$w $who $r $rps $p99 $cpu $bad"
    done
  done
done | tee "$WORK/rows"
echo "--- medians"
median() { sort -n | awk '{r[NR]=$1} END {print r[int((NR+1)/2)]}'; }
for w in json stream; do
  for who in base ours; do
    rps=$(awk -v w="$w" -v who="$who" '$1==w && $2==who {print $4}' "$WORK/rows" | median)
    cpu=$(awk -v w="$w" -v who="$who" '$1==w && $2==who {print $6}' "$WORK/rows" | median)
    echo "$w $who median_req_per_s $rps median_cpu_us_per_req $cpu"
  done
done | tee "$WORK/med"
for w in json stream; do
  awk -v w="$w" '$1==w {r[$2]=$4; c[$2]=$6} END {printf "ratio %s ours/base req_per_s %.3f cpu_per_req %.3f\n", w, r["ours"]/r["base"], c["ours"]/c["base"]}' "$WORK/med"
done
echo "load after: $(uptime)"
