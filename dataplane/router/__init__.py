"""The data-plane router: an asyncio HTTP/1.1 reverse proxy for the OpenAI-compatible API.

It authenticates a tenant's API key, rate-limits the tenant in model units (MU) against its
reservation, picks a runtime pod by in-flight MU (power of two choices inside a small sticky
subset per workload), proxies the request (SSE streaming passed through chunk by chunk),
retries a failed connection on another pod, ejects failing pods, and meters MU, tokens and
latency per endpoint and tenant. No Django imports.

Its modules, by job. Pure, without I/O and with time passed in:
  config          every timeout and limit of the router, with defaults
  pricing         the MU price of a request: estimated before it runs, metered after
  balancer        pod load and health (ejection, probes) and the balancing policies
  affinity        a request's workload and its sticky subset of pods (rendezvous hashing)
  ratelimit       GCRA and the traffic classes (pure), and the in-process limiter
  lease           leased shares of a reservation across routers: grants, demand, fallback
State and policy on the event loop:
  endpoint_state  one endpoint's live state: spec, pods, waiting requests, admitted MU rate
  admission       admission policies (probe, reserved, best effort or 429) and the queues
                  for a pod (target concurrency, scale from zero)
  server          the request handler (the hot path), the routing table, the lifecycle
Sockets, Redis and the control plane, at the edges:
  http            the client side of HTTP/1.1: parsing, limits, responses, backpressure
  upstream        connections to pods and their pool; ``fetch`` for one-off calls
  proxy           one exchange with a pod, streamed back to the client
  discovery       routing-table snapshots (static, or polled from the control plane);
                  endpointslices takes the pods from Kubernetes EndpointSlices instead
  control_plane   the router's calls to the control plane: wake, load samples, key lookups,
                  following the routing table
  keys            which tenant a bearer key belongs to: looked up once, kept while its
                  tenant's keys' epoch holds; lookups bounded
  lease_limiter   the limiter of routers sharing Redis: GCRA at the leased rate in process,
                  leases renewed in the background (one Lua script per endpoint)
  metering        per-second load samples (published to Redis), the cumulative
                  counters and the workers' snapshots of them
  exposition      GET /metrics in Prometheus text, summed over the workers

Run: ``python -m dataplane.router --help`` (static ``--backends`` or ``--control-plane`` mode).
Measure: bench/router_peers.sh (proxy speed against HAProxy and vllm-router),
bench/router_limiter.sh (the leased limiter against the in-process one and vllm-router, Redis
commands per request), bench/concurrency.sh (8,000 concurrent slow streams), bench/balancing.py
(policies and sticky subsets on a simulated fleet) and bench/balancing_http.py (policies through
real sockets in front of simulated engines).
"""
