"""Zero-downtime rollout of an endpoint's new version, as a pure state machine (time is a parameter).

One deployment per version. A rollout moves through:

    starting   the new version's deployment starts at its size (below) while its share of
               traffic stays where it is (0 % at first). When every new replica is ready:
    canary     (only with canary_percent > 0) the new version takes that share of traffic and
               holds there until promoted (or aborted), at most max_hold_s: then it is aborted.
               A promote starts the new version's remaining replicas (starting again, the
               canary's split kept) unless they are all ready already;
    draining   the new version takes all traffic; the old pods get no new request for drain_s,
               so routers drop them and their in-flight requests finish, then:
    done       the old deployment is removed.

A new version that is not ready within ready_deadline_s is rolled back: traffic goes back to
the old version, the new deployment is removed. An abort rolls back from any phase but done.

Each version runs, and the ledger commits, its share of the endpoint's replicas (`split`): the
share of traffic it takes, and while it starts the share it is about to take (a canary's
percent, or all of it); rounded up, at least one replica each. A canary of 10 % on 4 replicas
runs 1 new replica beside 4 old ones while it starts, then 1 beside 4 x 90 % -> 4; at 50 %, 2
beside 4, then 2 beside 2. While draining the old version keeps one replica until it goes.

Worked timeline (drain 10 s, deadline 600 s, 2 replicas, no canary): t=0 starting, 0% new
(2 old, 2 new); t=40 both new pods ready -> draining, 100% new (1 old, 2 new); t=50 -> done,
the old deployment goes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from math import ceil


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
    max_hold_s: float = 3600.0  # a canary not promoted within this is aborted, s


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
    severity: str = "info"  # the event's: "info", "warning" (an abort) or "critical" (a failure)


def start(now: float, canary_percent: int = 0) -> RolloutState:
    if not 0 <= canary_percent < 100:
        raise ValueError(f"canary_percent={canary_percent!r} must be in [0, 100)")
    return RolloutState(Phase.STARTING, 0, now, canary_percent)


def shares(r: RolloutState) -> tuple[int, int]:
    """The shares of the endpoint's traffic, in percent, that the (old, new) versions are sized
    for in r's phase: what each takes now, and, while the new one starts, what it takes once
    ready (a canary's percent, all of it when there is no canary or it was promoted)."""
    if r.phase is Phase.STARTING:
        return 100 - r.new_percent, r.canary_percent if r.canary_percent and not r.promoted else 100
    if r.phase is Phase.CANARY:
        return 100 - r.canary_percent, r.canary_percent
    if r.phase is Phase.DRAINING:
        return 0, 100
    raise ValueError(f"a {r.phase} rollout runs one version")


def version_replicas(share: int, replicas: int) -> int:
    """A version's replicas: `share` % of the endpoint's `replicas`, rounded up, at least one (and
    none of none): 10 % of 4 -> 1, 50 % of 3 -> 2, 0 % of 4 -> 1, any share of 0 -> 0."""
    return max(1, ceil(share * replicas / 100)) if replicas > 0 else 0


def split(r: RolloutState, replicas: int) -> tuple[int, int]:
    """The (old, new) versions' replicas of an endpoint of `replicas` in r's phase (`shares`)."""
    old, new = shares(r)
    return version_replicas(old, replicas), version_replicas(new, replicas)


def promoted(r: RolloutState) -> RolloutState:
    """r once promoted, as it is sized: a canary starts the rest of the new version (starting
    again, its split of traffic kept until they are ready)."""
    return replace(r, phase=Phase.STARTING if r.phase is Phase.CANARY else r.phase, promoted=True)


def advance(
    r: RolloutState, new_ready: int, replicas: int, now: float, cfg: RolloutConfig = RolloutConfig()
) -> Step:
    """The next state, from how many of the new version's pods are ready, the endpoint having
    `replicas` (the new version's own count is its share of them: `split`)."""
    if not r.phase.active:
        return Step(r, None)
    if r.aborted:
        return Step(
            RolloutState(Phase.ROLLED_BACK, 0, now, r.canary_percent),
            "aborted: traffic back on the old version",
            "warning",
        )
    if r.phase is Phase.STARTING:
        wanted = split(r, replicas)[1]
        if new_ready >= wanted:
            if r.canary_percent and not r.promoted:
                return Step(
                    RolloutState(Phase.CANARY, r.canary_percent, now, r.canary_percent),
                    f"{new_ready} new pods ready: canary at {r.canary_percent}% until promoted,"
                    f" at most {cfg.max_hold_s:g} s",
                )
            return Step(
                RolloutState(Phase.DRAINING, 100, now, r.canary_percent, r.promoted),
                f"{new_ready} new pods ready: 100% of traffic on the new version, old pods draining",
            )
        if now - r.since >= cfg.ready_deadline_s:
            return Step(
                RolloutState(Phase.ROLLED_BACK, 0, now, r.canary_percent),
                f"{new_ready} of {wanted} new pods ready after {cfg.ready_deadline_s:g} s: rolled back",
                "critical",
            )
        return Step(r, None)
    if r.phase is Phase.CANARY:
        if r.promoted:
            if new_ready >= replicas:
                return Step(
                    RolloutState(Phase.DRAINING, 100, now, r.canary_percent, True),
                    "promoted: 100% of traffic on the new version, old pods draining",
                )
            return Step(
                replace(promoted(r), since=now),
                f"promoted: the new version starts {replicas - new_ready} more replicas; traffic"
                f" stays {100 - r.canary_percent}/{r.canary_percent} until all {replicas} are ready",
            )
        if now - r.since >= cfg.max_hold_s:
            return Step(
                RolloutState(Phase.ROLLED_BACK, 0, now, r.canary_percent),
                f"canary held at {r.canary_percent}% for {now - r.since:g} s, past the most a canary"
                f" holds ({cfg.max_hold_s:g} s): aborted, traffic back on the old version",
                "warning",
            )
        return Step(r, None)
    if now - r.since >= cfg.drain_s:  # draining
        return Step(
            RolloutState(Phase.DONE, 100, now, r.canary_percent, r.promoted),
            "old version removed: rollout done",
        )
    return Step(r, None)
