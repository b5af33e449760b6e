"""The data-plane router: an asyncio HTTP/1.1 reverse proxy for the OpenAI-compatible API.

It authenticates a tenant's API key, rate-limits the tenant in model units (MU) against its
reservation, picks a runtime pod by in-flight MU (power of two choices inside a small sticky
subset per workload), proxies the request (SSE streaming passed through chunk by chunk),
retries a failed connection on another pod, ejects failing pods, and meters MU, tokens and
latency per endpoint and tenant. Pure decision logic (pricing, balancer, affinity, GCRA) lives
in small modules without I/O and with time passed in; sockets, Redis and the control plane are
at the edges (http, upstream, proxy, discovery, metering, server). No Django imports.

Run: ``python -m dataplane.router --help`` (static ``--backends`` or ``--control-plane`` mode).
Measure: bench/router_peers.sh (proxy speed against HAProxy and vllm-router), bench/concurrency.sh
(8,000 concurrent slow streams), bench/balancing.py (policies and sticky subsets on a simulated
fleet) and bench/balancing_http.py (policies through real sockets in front of simulated engines).
"""
