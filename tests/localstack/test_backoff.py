"""The restart policy of the embedded stack's supervisor: doubling waits after quick deaths,
capped, reset by a stable run, and a crash loop from the third quick death in a row."""

from controlplane.localstack.backoff import Policy, after_death

POLICY = Policy(base_s=1.0, cap_s=60.0, stable_s=60.0, crash_loop_after=3)


def test_a_process_that_ran_long_is_restarted_after_the_base_wait():
    decision = after_death(POLICY, quick_deaths=5, ran_s=3600.0)
    assert (decision.delay_s, decision.quick_deaths, decision.crash_loop) == (1.0, 1, False)


def test_quick_deaths_double_the_wait_up_to_the_cap_and_never_spin():
    quick, delays, loops = 0, [], []
    for _ in range(12):
        decision = after_death(POLICY, quick, ran_s=0.2)
        quick = decision.quick_deaths
        delays.append(decision.delay_s)
        loops.append(decision.crash_loop)
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60, 60]
    assert loops == [False, False] + [True] * 10
    # A crash loop costs one start a minute at most: 12 deaths took over 7 minutes of waits.
    assert sum(delays) > 7 * 60


def test_a_stable_run_after_a_crash_loop_starts_the_count_again():
    decision = after_death(POLICY, quick_deaths=9, ran_s=60.0)
    assert (decision.delay_s, decision.crash_loop) == (1.0, False)


def test_a_huge_count_of_quick_deaths_stays_at_the_cap():
    assert after_death(POLICY, quick_deaths=10_000, ran_s=0.0).delay_s == 60.0
