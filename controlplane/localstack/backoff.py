"""When a process of the embedded stack that died is started again: a pure policy, time passed in.

A process that ran for at least `stable_s` before it died is restarted after `base_s`; each death
after a shorter run doubles the wait, up to `cap_s`, so a process that dies at once (a crash
loop) costs one start per `cap_s`, not a spinning core. From the `crash_loop_after`-th quick
death in a row, the death is a crash loop (a critical on-call event, not a warning).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    base_s: float = 1.0
    cap_s: float = 60.0
    stable_s: float = 60.0
    crash_loop_after: int = 3


@dataclass(frozen=True)
class Restart:
    """The decision for one death: wait `delay_s`, then start it again."""

    delay_s: float
    quick_deaths: int  # deaths in a row after a run shorter than stable_s (this one included)
    crash_loop: bool


def after_death(policy: Policy, quick_deaths: int, ran_s: float) -> Restart:
    """The restart after a death of a process that ran `ran_s` seconds, `quick_deaths` being the
    count of quick deaths in a row before this one."""
    quick = 1 if ran_s >= policy.stable_s else quick_deaths + 1
    delay = min(policy.cap_s, policy.base_s * 2.0 ** min(quick - 1, 30))
    return Restart(delay_s=delay, quick_deaths=quick, crash_loop=quick >= policy.crash_loop_after)
