"""The data-plane router: an asyncio HTTP/1.1 reverse proxy for the OpenAI-compatible API.

It authenticates a tenant's API key, rate-limits the tenant in model units (MU) against its
reservation, picks a runtime pod by in-flight MU (power of two choices inside a small sticky
subset per workload), proxies the request (SSE streaming passed through chunk by chunk), retries
a failed connection on another pod, ejects failing pods, and meters MU, tokens and latency per
endpoint and tenant. No Django imports; the pure modules (``config``, ``pricing``, ``balancer``,
``affinity``, ``ratelimit``, ``lease``) do no I/O and take time as a parameter: keep them so.
Run: ``python -m dataplane.router --help``. Every module by job, and the benches: docs/router.md,
"How the router is built".
"""
