#!/usr/bin/env bash
# What a request costs the router, in CPU instructions: noise-free (a busy machine changes
# requests/s, not the instructions a request executes), so a few % are seen where
# router_metering.sh's requests/s swing more than that. This tree's router against the one
# before exact metering (BASE_REF, default f602ef5, exported with git archive), side by side.
# The router runs under valgrind (cachegrind, no cache simulation, counting only), in-process
# (Router + StaticDiscovery, p2c-mu, the in-process GCRA never denying), on real sockets; nginx
# pods answer at once; the client (16 keep-alive connections) runs in its own process, not
# counted. Two runs a workload and router, of SHORT and LONG requests: their difference over
# LONG - SHORT is the instructions a request costs, start-up and shutdown cancelled out.
# Workloads, as router_metering.sh's:
#   json    a completion of 50 tokens with usage (ours holds it to send x-mu-cost);
#   stream  "stream": true, 16 token events + the usage chunk + [DONE] in vLLM's compact JSON.
# Env: SHORT (160), LONG (1760), BASE_REF, PY. Needs valgrind and nginx
# (apt-get install -y valgrind nginx-light); without them it prints a skip line and exits 0.
# About 2 minutes on an idle core (valgrind runs Python ~50x slower).
# --smoke: the json workload of 16 and 32 requests
#   (tests/test_bench_smoke.py runs it): does it still run, not what it gives.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKLOADS=${WORKLOADS:-}
if [[ ${1:-} == --smoke ]]; then SHORT=${SHORT:-16} LONG=${LONG:-32} WORKLOADS=${WORKLOADS:-json}; fi
WORKLOADS=${WORKLOADS:-json stream}
PY=${PY:-$(pwd)/.venv/bin/python}
BASE_REF=${BASE_REF:-f602ef5}
SHORT=${SHORT:-160} LONG=${LONG:-1760}
for tool in valgrind nginx; do
  command -v $tool >/dev/null || { echo "skip router_instructions: needs $tool (apt-get install -y valgrind nginx-light)"; exit 0; }
done
WORK=$(mktemp -d /tmp/router-instructions.XXXXXX)
cleanup() { [[ -f $WORK/nginx.pid ]] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
mkdir "$WORK/base" && git archive "$BASE_REF" | tar -x -C "$WORK/base"

source "$(dirname "$0")/nginx_pods.sh"
start_nginx_pods "$WORK" 1024 18321 18322 18331 18332

cat >"$WORK/router.py" <<'PY'
"""The router on real sockets until it has served TOTAL requests: router.py json|stream PORT TOTAL"""
import asyncio, sys
import uvloop
from dataplane.router.config import RouterConfig
from dataplane.router.discovery import StaticDiscovery, static_table
from dataplane.router.server import Router
workload, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pods = ["http://127.0.0.1:1832%d" % i if workload == "json" else "http://127.0.0.1:1833%d" % i for i in (1, 2)]
async def main():
    router = Router(RouterConfig())
    await router.start("127.0.0.1", port, StaticDiscovery(static_table(pods, "p2c-mu", 64, 1e12)))
    while sum(s.requests for s in router.meter.totals.values()) < total:
        await asyncio.sleep(0.05)
    await router.shutdown(0.1)
uvloop.run(main())
PY
cat >"$WORK/client.py" <<'PY'
"""N requests on 16 keep-alive connections to 127.0.0.1:PORT, once it listens: client.py json|stream PORT N"""
import asyncio, sys
workload, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
body = b'{"model":"m","prompt":"The quick brown fox jumps over the lazy dog and keeps on running","max_tokens":50,"stream":%s}' % (b"true" if workload == "stream" else b"false")
request = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
async def connection(k):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(k):
        w.write(request)
        head = (await r.readuntil(b"\r\n\r\n")).lower()
        assert head.startswith(b"http/1.1 200"), head
        if b"content-length:" in head:
            i = head.index(b"content-length:") + 15
            await r.readexactly(int(head[i : head.index(b"\r\n", i)]))
        else:
            await r.readuntil(b"0\r\n\r\n")
    w.close()
async def main():
    for _ in range(6000):  # valgrind starts Python slowly
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            break
        except OSError:
            await asyncio.sleep(0.05)
    await asyncio.gather(*(connection(n // 16) for _ in range(16)))
asyncio.run(main())
PY

port=18340
instructions() {  # tree workload requests -> the router's instructions for the whole run
  port=$((port + 1))
  (cd "$1" && PYTHONPATH="$1" valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
     "$PY" "$WORK/router.py" "$2" "$port" "$3" >"$WORK/valgrind.out" 2>&1) &
  local router=$!
  "$PY" "$WORK/client.py" "$2" "$port" "$3"
  wait $router
  awk '/I *refs:/ {gsub(",", "", $4); print $4}' "$WORK/valgrind.out"
}
per_request() { local a b; a=$(instructions "$1" "$2" "$SHORT"); b=$(instructions "$1" "$2" "$LONG"); echo $(((b - a) / (LONG - SHORT))); }
printf '%-8s %14s %14s %8s\n' workload "base ($BASE_REF)" ours ratio
for w in $WORKLOADS; do
  base=$(per_request "$WORK/base" $w); ours=$(per_request "$(pwd)" $w)
  printf '%-8s %14s %14s %8s\n' $w "$base" "$ours" "$(awk -v a="$ours" -v b="$base" 'BEGIN {printf "%.3f", a / b}')"
done
echo "(instructions a request executes in the router process; goal: ratio <= 1.05)"
