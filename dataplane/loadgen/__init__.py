"""The load generator: completions through the router, streamed on kept-alive connections, in
closed-loop stages or as an open-loop replay of a request trace, reporting throughput and
latency (end to end, time to first token, inter-token) every 5 s. ``measure`` and ``trace`` are
pure; ``run`` holds the HTTP client and the clock; ``python -m dataplane.loadgen`` is the CLI.
"""
