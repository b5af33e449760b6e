#!/usr/bin/env bash
# Proxy speed of our router against HAProxy and the Rust vllm-router (/work/shared/bench/router-peers.sh
# or bench/router-peers.sh next to this file). Our router runs with p2c-mu and the in-process GCRA on
# the hot path: --rate-limit-mu-per-min 1e12 is a static reservation so generous it never denies, so
# every request pays for the limiter check without being throttled.
# Env: DURATION (default 5), ROUNDS (default 3), WORKERS (default 2), PEERS (path of router-peers.sh).
# --smoke: one round of 1 s, 8 connections
#   (tests/test_bench_smoke.py runs it): does it still run, not what it gives.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --smoke ]]; then
  DURATION=${DURATION:-1} ROUNDS=${ROUNDS:-1}; export CONNS=${CONNS:-8}  # the peers script's
fi
PEERS=${PEERS:-/work/shared/bench/router-peers.sh}
PY=${PY:-$(pwd)/.venv/bin/python}
WORKERS=${WORKERS:-2}
echo "load before: $(uptime)"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
DURATION=${DURATION:-5} ROUNDS=${ROUNDS:-3} bash "$PEERS" \
  "$PY -m dataplane.router --listen 127.0.0.1:{port} --backends {backends} --policy p2c-mu --rate-limit-mu-per-min 1e12 --workers $WORKERS" \
  | tee "$OUT"
# The peers script gives medians of requests/s only; the goal also names p99, so the median of the
# rounds' p99 per router and the ratios to ours (below 1.0: ours is faster at the tail).
"$PY" - "$OUT" <<'PY'
import statistics, sys
p99 = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 6 and f[1].isdigit():
        p99.setdefault(f[0], []).append(float(f[4]))
med = {r: statistics.median(v) for r, v in p99.items()}
for r, m in med.items():
    print(f"{r} median_p99_ms {m:.2f}")
for r, m in med.items():
    if r != "ours" and "ours" in med:
        print(f"ratio ours/{r} p99 {med['ours'] / m:.2f}")
PY
echo "load after: $(uptime)"
