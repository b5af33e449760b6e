"""Admission and queueing: whether a request may run now, and how it waits for a pod.

An admission policy gives a priced request its traffic class before it goes anywhere, or refuses
it with 429 + Retry-After; after the request it settles the difference between the exact price
and the estimate. The router holds one policy, made by name by ``make_admission`` (as
``balancer.make_policy`` makes balancing policies). Policies:
  reservation-first  probes (``is_probe``: the prober credential) always; reserved traffic
                     while it conforms to the endpoint's reservation (GCRA through the
                     router's ``Limiter``); best effort beyond it while the endpoint has
                     headroom: what this router admitted over ``best_effort_window_s`` plus
                     what the limiter last heard the other routers admit, below capacity
                     (``ratelimit.classify`` has the table). Nothing here waits on Redis.

Queueing: an admitted request that finds no pod under its target concurrency waits in its
endpoint's queue (``wait_for_room``: reserved traffic and probes first, the newest best-effort
waiter shed to make room for them, 503 at ``queue_wait_s``); one that finds no ready pod at all
is held while a scale-to-zero endpoint wakes (``wait_for_pods``: the wake call repeated every
``wake_retry_s``, 503 at ``wake_deadline_s``; 503 at once for an endpoint that cannot scale to
zero). ``queue_for_pod`` chooses between the two.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from dataplane.router.balancer import PodLoad
from dataplane.router.config import RouterConfig
from dataplane.router.endpoint_state import EndpointState
from dataplane.router.http import RequestError
from dataplane.router.ratelimit import Limiter, TrafficClass, classify, has_headroom, retry_after_header
from dataplane.router.validation import lax_int

Wake = Callable[[int], None]  # start the wake call of an endpoint (by id) in the background


class Admission(Protocol):
    """An admission policy: one per router, asked once per request before any pod is picked."""

    async def admit(self, ep: EndpointState, cost_mu: float, is_probe: bool, now: float) -> TrafficClass:
        """The request's class (never REJECTED); raises a 429 ``RequestError`` to refuse it."""
        ...

    def settle(self, ep: EndpointState, is_probe: bool, estimated_mu: float, exact_mu: float) -> None:
        """The request was metered at ``exact_mu``; it was admitted at ``estimated_mu``."""
        ...


class ReservationFirst:
    """Probe, reserved (GCRA conforms) or best effort (headroom); else 429 + Retry-After."""

    def __init__(self, limiter: Limiter, config: RouterConfig) -> None:
        self.limiter = limiter
        self.retry_after_s = config.retry_after_s  # the least Retry-After of a 429, s

    async def admit(self, ep: EndpointState, cost_mu: float, is_probe: bool, now: float) -> TrafficClass:
        res = ep.spec.reservation
        conforms = False
        retry_after = float(self.retry_after_s)
        if ep.limit is not None and not is_probe:  # no reservation: no GCRA
            d = await self.limiter.check(ep.limit_key, cost_mu, ep.limit)
            conforms = d.allowed
            retry_after = max(retry_after, d.retry_after_s)
        best_effort_allowed = res is None or res.best_effort_allowed
        # the headroom window is only read when it decides (best effort candidates)
        headroom = (
            not is_probe
            and not conforms
            and best_effort_allowed
            and has_headroom(
                ep.rate.rate_per_min(now) + self.limiter.others_mu_per_min(ep.limit_key),
                cost_mu,
                ep.capacity_mu_per_min(),
            )
        )
        cls = classify(is_probe, res is not None, conforms, best_effort_allowed, headroom)
        if cls is TrafficClass.REJECTED:
            why = "reservation exhausted and " if res else ""
            raise RequestError(
                429,
                f"rate limit for {ep.spec.name!r} reached: {why}no headroom for best-effort traffic",
                "rate_limit_exceeded",
                b"retry-after: %s\r\n" % retry_after_header(retry_after).encode(),
            )
        ep.rate.add(now, cost_mu)
        if not is_probe and self.limiter.reports_admitted:
            self.limiter.admitted(ep.limit_key, cost_mu)
        return cls

    def settle(self, ep: EndpointState, is_probe: bool, estimated_mu: float, exact_mu: float) -> None:
        """Charge the reservation the exact price: the difference lands on its next check."""
        if ep.limit is not None and not is_probe and exact_mu != estimated_mu:
            self.limiter.correct(ep.limit_key, exact_mu - estimated_mu)


ADMISSION_NAMES = ("reservation-first",)
DEFAULT_ADMISSION = "reservation-first"


def make_admission(name: str, limiter: Limiter, config: RouterConfig) -> Admission:
    """The admission policy of a router; ``limiter`` holds the reservations' GCRA state."""
    table: dict[str, Callable[[Limiter, RouterConfig], Admission]] = {
        "reservation-first": ReservationFirst,
    }
    try:
        policy = table[name]
    except KeyError:
        raise ValueError(f"unknown admission policy {name!r}; one of {', '.join(ADMISSION_NAMES)}") from None
    return policy(limiter, config)


def is_probe(probe_header: bytes | None, probe_key: bytes | None) -> bool:
    """A health probe (the probe class: never shed, outside any reservation): the probe header
    carries the router's prober credential (``--probe-key-file`` / ``$ROUTER_PROBE_KEY``).
    Without a credential configured nothing is a probe; any other header value is ignored."""
    if probe_key is None or probe_header is None:
        return False
    return hmac.compare_digest(probe_header, probe_key)


TENANT_MIN_PRIORITY = 0  # vLLM runs a lower priority first: below 0 is for the probes only


def clamp_tenant_priority(body: dict[str, Any]) -> bool:
    """Raise a tenant's ``priority`` below ``TENANT_MIN_PRIORITY`` to it, in place (the body the
    pod gets); True when the body changed. A value vLLM would not read as an integer is left
    for the engine to refuse. The priority never changes what the router admits."""
    priority = lax_int(body.get("priority"))
    if priority is None or priority >= TENANT_MIN_PRIORITY:
        return False
    body["priority"] = TENANT_MIN_PRIORITY
    return True


# --- queueing -----------------------------------------------------------------------------


async def queue_for_pod(
    ep: EndpointState,
    cost_mu: float,
    priority: bool,
    tried: Sequence[PodLoad],
    deadline: float,
    model: str,
    clock: Callable[[], float],
    wake: Wake,
) -> float:
    """No pod may take the request now: hold it until one may, or answer it. Returns the
    deadline of its next wait (a pod woken from zero gives it a fresh ``queue_wait_s``).

    Every pod ``tried`` failed to connect -> 502; no pod ready -> ``wait_for_pods``; every ready
    pod at its target concurrency -> ``wait_for_room`` until ``deadline``, then 503."""
    cfg = ep.config
    ep.queued_mu += cost_mu  # the backlog the autoscaler drains (metered each second)
    try:
        if not any(p.available() for p in ep.pods if p not in tried):
            if tried:  # every pod failed to connect
                raise RequestError(502, "no pod could be reached", "upstream_unreachable")
            await wait_for_pods(ep, clock, wake)
            return clock() + cfg.queue_wait_s
        if not await wait_for_room(ep, priority, deadline - clock()):
            raise RequestError(
                503,
                f"all pods of {model!r} are at their concurrency limit",
                "overloaded",
                b"retry-after: %d\r\n" % cfg.retry_after_s,
            )
        return deadline
    finally:
        ep.queued_mu -= cost_mu


async def wait_for_room(ep: EndpointState, priority: bool, timeout_s: float) -> bool:
    """Queue until a pod frees up. False: queue full, shed, or timed out (-> 503)."""
    if timeout_s <= 0:
        return False
    if ep.queued() >= ep.config.max_queued_requests:
        if priority and ep.waiters:  # shed the newest best-effort waiter, never a reserved one
            victim = ep.waiters.pop()
            if not victim.done():
                victim.set_result(False)
        else:
            return False
    fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    q = ep.waiters_priority if priority else ep.waiters
    q.append(fut)
    try:
        return await asyncio.wait_for(fut, timeout_s)
    except TimeoutError:
        return False
    finally:
        with contextlib.suppress(ValueError):
            q.remove(fut)


async def wait_for_pods(ep: EndpointState, clock: Callable[[], float], wake: Wake) -> None:
    """No pod available: wake a scale-to-zero endpoint and hold the request, else 503."""
    cfg = ep.config
    retry = b"retry-after: %d\r\n" % cfg.retry_after_s
    if not ep.spec.scale_to_zero_enabled:
        raise RequestError(503, f"no ready pod for {ep.spec.name!r}", "no_ready_pod", retry)
    deadline = clock() + cfg.wake_deadline_s
    while not any(p.available() for p in ep.pods):
        now = clock()
        if now >= deadline:
            raise RequestError(
                503, f"{ep.spec.name!r} is waking up from zero; try again", "scaling_from_zero", retry
            )
        if now - ep.wake_sent_at >= cfg.wake_retry_s:
            ep.wake_sent_at = now
            wake(ep.spec.id)
        changed = ep.changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), min(deadline - now, cfg.wake_retry_s))
