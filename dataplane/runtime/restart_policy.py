"""When to restart a failed pod, and when its restarts have become a crash loop. Pure.

Like Kubernetes' CrashLoopBackOff: the first restarts are immediate; once ``crash_loop_restarts``
(3) restarts fall within ``window_s`` (300 s), each further restart waits
base x 2^(n - threshold), capped: 1 s, 2 s, 4 s ... 60 s. Worked example with the defaults:
restarts at t=0 and 10 s are immediate; the third, at t=20 s, makes a crash loop and waits
1 s; a fourth within the window waits 2 s. Restarts older than the window are forgotten, so
a pod that ran fine for 5 minutes starts over with immediate restarts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    window_s: float = 300.0  # restarts within this window count towards a crash loop, seconds
    crash_loop_restarts: int = 3  # restarts within the window that make a crash loop, >= 1
    backoff_base_s: float = 1.0  # first delay once crash-looping, seconds
    backoff_cap_s: float = 60.0  # longest delay, seconds


@dataclass(frozen=True)
class RestartDecision:
    delay_s: float  # wait this long before starting the pod again, seconds
    crash_loop: bool  # the restart history is a crash loop (report it)
    recent_restarts: int  # restarts within the window, including this one


def decide_restart(policy: RestartPolicy, history: tuple[float, ...], now: float) -> RestartDecision:
    """Decide for a restart at ``now``; ``history`` holds the times of earlier restarts."""
    recent = 1 + sum(1 for t in history if now - t <= policy.window_s)
    if recent < policy.crash_loop_restarts:
        return RestartDecision(0.0, False, recent)
    excess = recent - policy.crash_loop_restarts
    delay = min(policy.backoff_cap_s, policy.backoff_base_s * 2**excess)
    return RestartDecision(delay, True, recent)
