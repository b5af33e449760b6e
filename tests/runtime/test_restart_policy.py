"""Crash loops are recognised and backed off; old restarts are forgotten."""

from __future__ import annotations

from dataplane.runtime.restart_policy import RestartPolicy, decide_restart

POLICY = RestartPolicy(window_s=300, crash_loop_restarts=3, backoff_base_s=1, backoff_cap_s=60)


def test_first_restarts_are_immediate() -> None:
    assert decide_restart(POLICY, (), 0).delay_s == 0
    second = decide_restart(POLICY, (0.0,), 10)
    assert (second.delay_s, second.crash_loop, second.recent_restarts) == (0, False, 2)


def test_repeated_restarts_become_a_crash_loop_with_backoff() -> None:
    # Restarts at 0 and 10 s; the third at 20 s is a crash loop and waits 1 s; then 2, 4 s...
    third = decide_restart(POLICY, (0.0, 10.0), 20)
    assert (third.delay_s, third.crash_loop, third.recent_restarts) == (1, True, 3)
    assert decide_restart(POLICY, (0.0, 10.0, 20.0), 30).delay_s == 2
    assert decide_restart(POLICY, (0.0, 10.0, 20.0, 30.0), 40).delay_s == 4
    assert decide_restart(POLICY, tuple(float(t) for t in range(0, 200, 10)), 200).delay_s == 60


def test_restarts_outside_the_window_are_forgotten() -> None:
    later = decide_restart(POLICY, (0.0, 10.0, 20.0), 400)
    assert (later.delay_s, later.crash_loop, later.recent_restarts) == (0, False, 1)
