"""Every timeout and limit of the router in one frozen dataclass, with defaults.

The defaults suit a router in front of LLM pods: requests are small JSON bodies, responses may
stream for minutes, and the router must shed load with a clear status rather than queue forever.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from dataplane.wire.load_samples import BILLING_STREAM_MAX_ENTRIES, CATCH_UP_S, ROW_TTL_S

STALE_TABLE_MODES = ("fail-closed", "fail-open")


@dataclass(frozen=True)
class RouterConfig:
    # --- client side
    header_read_timeout_s: float = 10.0  # first byte of a request -> end of its headers, s (else 408)
    body_read_timeout_s: float = 30.0  # end of headers -> end of body, s (else 408)
    idle_keepalive_s: float = 75.0  # an idle client keep-alive connection is closed after, s
    max_header_bytes: int = 65_536  # request line + headers, bytes (else 431)
    max_body_bytes: int = 4 * 1024 * 1024  # request body, bytes (else 413); 4 MiB ~ 1M-token prompt
    max_pipelined_requests: int = 16  # parsed requests queued on one connection before pausing reads
    # --- backpressure: a transport whose write buffer passes high_water pauses its peer's reads
    write_high_water_bytes: int = 256 * 1024  # bytes buffered towards a slow reader before pausing
    write_low_water_bytes: int = 64 * 1024  # bytes left in that buffer when reading resumes
    # --- upstream (pods)
    upstream_connect_timeout_s: float = 2.0  # TCP connect to a pod, s (then retry another pod)
    # longest silence from a pod mid-response, s (then 504/close); as long without a read by its
    # client while the pod waits on it (backpressure): the client is cut
    upstream_read_timeout_s: float = 600.0
    # A client that leaves after its pod has been silent this long gave up on a stall: counted an
    # error (a client that leaves while tokens flow stopped its generation: none), s
    gave_up_after_silence_s: float = 10.0
    # A pooled idle connection to a pod is closed after this, s. Below the pods' own keep-alive
    # (uvicorn's 5 s, vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE), so the router never reuses a
    # connection at the moment the pod closes it.
    upstream_idle_keepalive_s: float = 4.0
    max_idle_connections_per_pod: int = 512  # idle keep-alive connections kept per pod
    max_attempts: int = 3  # pods tried for one request when connections fail before any byte
    # --- admission and queueing
    queue_wait_s: float = 2.0  # longest wait for a pod under its target concurrency, s (then 503)
    max_queued_requests: int = 1024  # waiting requests per endpoint (beyond: 503 at once)
    retry_after_s: int = 1  # Retry-After on 503 (queue full/timeout), s
    default_max_tokens: int = 256  # output tokens priced when a request sets no max_tokens, tokens
    gcra_burst_s: float = 10.0  # reservation burst tolerance: this many seconds of the rate, s
    best_effort_window_s: float = 10.0  # window of the endpoint MU rate compared with capacity, s
    # A request whose probe header carries the prober credential (--probe-key-file or
    # $ROUTER_PROBE_KEY, never a flag) is a health probe (never shed); without it, ignored.
    probe_header: str = "x-probe"
    # n (sequences per prompt) at most, else 400; OpenAI's own limit (vLLM's is 16,384)
    max_n: int = 128
    # --- sticky subsets
    sticky_subset_size: int = 2  # pods per workload subset (0 = off); 2 = one spare pod per workload
    sticky_hot_ratio: float = 0.5  # leave the subset when its best pod has > (1+ratio) x fleet mean MU
    sticky_hot_abs_mu: float = 10.0  # ... plus this absolute margin, MU (ignores noise when idle)
    # --- pod health
    eject_after_failures: int = 3  # consecutive connect failures/5xx-before-bytes that eject a pod
    eject_backoff_s: float = 1.0  # first probe after ejection, s; doubles per failed probe
    eject_backoff_max_s: float = 30.0  # cap of that backoff, s
    probe_timeout_s: float = 1.0  # GET /health on an ejected pod, s
    # --- scale from zero
    wake_deadline_s: float = 30.0  # longest hold of a request while an endpoint wakes, s (then 503)
    wake_retry_s: float = 5.0  # repeat the wake call at most this often per endpoint, s
    # --- discovery, metering, lifecycle
    # Routing-table poll period in control-plane mode, s (jittered 0.8-1.2x): a revoked key is
    # refused within 1.2 s and a poll; an unchanged table is a 304.
    poll_interval_s: float = 1.0
    # Control-plane mode: keys from a table the control plane has not confirmed (a new table or a
    # 304) for this long are refused, s (0 = never): a revoked key stays in a table that cannot be
    # refreshed. stale_table: "fail-closed" (tenant requests get 503) or "fail-open" (served,
    # logged and counted in router_stale_table_requests_total; availability over revocation).
    stale_table_after_s: float = 600.0
    stale_table: str = "fail-closed"
    control_plane_timeout_s: float = 5.0  # one control-plane request, s
    # Keys the routing table does not carry are looked up at the control plane (keys.KeyBook):
    # at most key_lookups_per_s a second per process (a bucket of key_lookup_burst; past it 503 +
    # Retry-After), a miss kept unknown_key_ttl_s, at most keys_known_max answers and
    # unknown_keys_max misses kept (the least recently used go first)
    key_lookups_per_s: float = 20.0
    key_lookup_burst: int = 50
    unknown_key_ttl_s: float = 5.0
    keys_known_max: int = 100_000
    unknown_keys_max: int = 10_000
    metrics_ttl_s: int = ROW_TTL_S  # TTL of per-second load keys in Redis, s (past the collector's catch-up)
    # With Redis: the billing stream's bound, entries; past it billable seconds are held here
    billing_stream_max_entries: int = BILLING_STREAM_MAX_ENTRIES
    # Metered seconds not yet acknowledged by their sink (dataplane.router.delivery): held in
    # memory up to this, bytes (past it, with --spool-dir on disk only, else the oldest dropped);
    # 32 MiB is about 9 hours of a router serving 10 endpoints (~1 KB a second)
    metering_memory_bytes: int = 32 * 1024 * 1024
    spool_max_bytes: int = 1024 * 1024 * 1024  # with --spool-dir: those seconds' files, bytes at most
    drain_timeout_s: float = 30.0  # graceful shutdown: wait this long for in-flight requests, s
    backlog: int = 4096  # listen() backlog, connections

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float) and value < 0:
                raise ValueError(f"RouterConfig.{f.name} must be >= 0, got {value!r}")
        if self.write_low_water_bytes > self.write_high_water_bytes:
            raise ValueError(
                f"RouterConfig.write_low_water_bytes ({self.write_low_water_bytes}) must not exceed "
                f"write_high_water_bytes ({self.write_high_water_bytes})"
            )
        if self.max_n < 1:
            raise ValueError(f"RouterConfig.max_n must be >= 1, got {self.max_n}")
        if self.stale_table not in STALE_TABLE_MODES:
            raise ValueError(
                f"RouterConfig.stale_table must be one of {', '.join(STALE_TABLE_MODES)}, "
                f"got {self.stale_table!r}"
            )
        if self.max_attempts < 1:
            raise ValueError(f"RouterConfig.max_attempts must be >= 1, got {self.max_attempts}")
        if self.metrics_ttl_s <= CATCH_UP_S:  # shorter, a collector's pause loses the autoscaler's buckets
            raise ValueError(
                f"RouterConfig.metrics_ttl_s must be over {CATCH_UP_S} (the control plane's catch-up), "
                f"got {self.metrics_ttl_s}"
            )
