"""Zero-downtime rollout of an endpoint's new version, as a pure state machine (time is a parameter).

One deployment per version. A rollout moves through:

    starting   the new version's deployment runs at the endpoint's replicas; all traffic stays
               on the old one. When every new replica is ready:
    canary     (only with canary_percent > 0) the new version takes that share of traffic and
               holds there until an operator promotes it (or aborts);
    draining   the new version takes all traffic; the old pods get no new request for drain_s,
               so routers drop them and their in-flight requests finish, then:
    done       the old deployment is removed.

A new version that is not ready within ready_deadline_s is rolled back: traffic never left the
old version, the new deployment is removed. An abort rolls back from any phase but done.

Worked timeline (drain 10 s, deadline 600 s, 2 replicas, no canary): t=0 starting, 0% new;
t=40 both new pods ready -> draining, 100% new; t=50 -> done, the old deployment goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Phase(StrEnum):
    """While a phase is active both versions run; after it, only the endpoint's version does
    (the new one when done, the old one again when rolled back)."""

    STARTING = "starting"
    CANARY = "canary"
    DRAINING = "draining"
    DONE = "done"
    ROLLED_BACK = "rolled_back"

    @property
    def active(self) -> bool:
        return self not in (Phase.DONE, Phase.ROLLED_BACK)


@dataclass(frozen=True)
class RolloutConfig:
    drain_s: float = 10.0  # old pods take no new request this long before they are removed, s
    ready_deadline_s: float = 600.0  # the new version must be ready within this, s; else roll back


@dataclass(frozen=True)
class RolloutState:
    phase: Phase
    new_percent: int  # share of the endpoint's traffic the new version takes, 0..100
    since: float  # when the phase began, unix s
    canary_percent: int = 0  # hold at this share until promoted; 0: straight through
    promoted: bool = False
    aborted: bool = False


@dataclass(frozen=True)
class Step:
    rollout: RolloutState
    event: str | None  # what changed, for the Event; None when nothing did


def start(now: float, canary_percent: int = 0) -> RolloutState:
    if not 0 <= canary_percent < 100:
        raise ValueError(f"canary_percent={canary_percent!r} must be in [0, 100)")
    return RolloutState(Phase.STARTING, 0, now, canary_percent)


def advance(
    r: RolloutState, new_ready: int, replicas: int, now: float, cfg: RolloutConfig = RolloutConfig()
) -> Step:
    """The next state, from how many of the new version's pods are ready out of `replicas`."""
    if not r.phase.active:
        return Step(r, None)
    if r.aborted:
        return Step(
            RolloutState(Phase.ROLLED_BACK, 0, now, r.canary_percent),
            "aborted: traffic back on the old version",
        )
    if r.phase is Phase.STARTING:
        if new_ready >= replicas:
            if r.canary_percent and not r.promoted:
                return Step(
                    RolloutState(Phase.CANARY, r.canary_percent, now, r.canary_percent),
                    f"{new_ready} new pods ready: canary at {r.canary_percent}% until promoted",
                )
            return Step(
                RolloutState(Phase.DRAINING, 100, now, r.canary_percent, r.promoted),
                f"{new_ready} new pods ready: 100% of traffic on the new version, old pods draining",
            )
        if now - r.since >= cfg.ready_deadline_s:
            return Step(
                RolloutState(Phase.ROLLED_BACK, 0, now, r.canary_percent),
                f"{new_ready} of {replicas} new pods ready after {cfg.ready_deadline_s:g} s: rolled back",
            )
        return Step(r, None)
    if r.phase is Phase.CANARY:
        if r.promoted:
            return Step(
                RolloutState(Phase.DRAINING, 100, now, r.canary_percent, True),
                "promoted: 100% of traffic on the new version, old pods draining",
            )
        return Step(r, None)
    if now - r.since >= cfg.drain_s:  # draining
        return Step(
            RolloutState(Phase.DONE, 100, now, r.canary_percent, r.promoted),
            "old version removed: rollout done",
        )
    return Step(r, None)
