"""The rollout phases on synthetic time, with the worked numbers of dataplane.cluster.rollout."""

from dataclasses import replace

import pytest

from dataplane.cluster.rollout import (
    Phase,
    RolloutConfig,
    RolloutState,
    advance,
    shares,
    split,
    start,
    version_replicas,
)

CFG = RolloutConfig(drain_s=10.0, ready_deadline_s=600.0)


def test_ready_new_pods_take_all_traffic_then_the_old_ones_go_after_the_drain():
    r = start(now=0.0)
    assert (r.phase, r.new_percent, r.phase.active) == (Phase.STARTING, 0, True)
    step = advance(r, new_ready=1, replicas=2, now=30.0, cfg=CFG)
    assert step.rollout is r and step.event is None  # one of two ready: traffic stays old
    step = advance(r, new_ready=2, replicas=2, now=40.0, cfg=CFG)
    r = step.rollout
    assert (r.phase, r.new_percent, r.since) == (Phase.DRAINING, 100, 40.0)
    assert "2 new pods ready" in step.event
    assert advance(r, 2, 2, now=49.9, cfg=CFG).rollout is r  # old pods still finishing
    done = advance(r, 2, 2, now=50.0, cfg=CFG).rollout
    assert (done.phase, done.phase.active) == (Phase.DONE, False)
    assert advance(done, 0, 2, now=99.0, cfg=CFG).event is None  # terminal


def test_a_canary_holds_its_share_until_promoted_then_starts_the_rest_of_the_new_version():
    # 10 % of 3 replicas: one new replica is the canary's; it takes 10 % once ready.
    r = start(0.0, canary_percent=10)
    assert split(r, 3) == (3, 1)
    r = advance(r, new_ready=1, replicas=3, now=20.0, cfg=CFG).rollout
    assert (r.phase, r.new_percent, split(r, 3)) == (Phase.CANARY, 10, (3, 1))  # 90 % of 3 -> 3
    assert advance(r, 1, 3, now=3619.0, cfg=CFG).rollout is r  # no deadline once serving, until the hold
    # Promoted: the new version starts its other two replicas, the 90/10 split kept meanwhile.
    step = advance(replace(r, promoted=True), 1, 3, now=3000.0, cfg=CFG)
    starting = step.rollout
    assert (starting.phase, starting.new_percent, starting.since, split(starting, 3)) == (
        Phase.STARTING, 10, 3000.0, (3, 3),
    )  # fmt: skip
    assert "starts 2 more replicas" in step.event and "90/10" in step.event
    assert advance(starting, 2, 3, now=3010.0, cfg=CFG).rollout is starting
    draining = advance(starting, 3, 3, now=3020.0, cfg=CFG).rollout
    assert (draining.phase, draining.new_percent, split(draining, 3)) == (Phase.DRAINING, 100, (1, 3))
    # All ready already (a canary of one replica's endpoint): straight to draining.
    assert advance(replace(r, promoted=True), 3, 3, now=3000.0, cfg=CFG).rollout.phase is Phase.DRAINING


def test_a_canary_held_past_its_hold_is_aborted_with_a_warning():
    r = advance(start(0.0, canary_percent=50), new_ready=2, replicas=4, now=20.0, cfg=CFG).rollout
    assert (r.phase, split(r, 4)) == (Phase.CANARY, (2, 2))
    assert advance(r, 2, 4, now=20.0 + 3599.9, cfg=CFG).rollout is r
    step = advance(r, 2, 4, now=20.0 + 3600.0, cfg=CFG)
    assert (step.rollout.phase, step.rollout.new_percent, step.severity) == (Phase.ROLLED_BACK, 0, "warning")
    assert step.event == (
        "canary held at 50% for 3600 s, past the most a canary holds (3600 s): aborted, traffic back"
        " on the old version"
    )
    short = RolloutConfig(max_hold_s=60.0)
    assert advance(r, 2, 4, now=80.0, cfg=short).rollout.phase is Phase.ROLLED_BACK


def test_each_version_runs_its_share_rounded_up_at_least_one():
    assert [version_replicas(share, 4) for share in (0, 10, 25, 26, 50, 90, 100)] == [1, 1, 1, 2, 2, 4, 4]
    assert [version_replicas(share, 0) for share in (0, 50, 100)] == [0, 0, 0]  # none of none
    straight = start(0.0)
    assert split(straight, 4) == (4, 4)  # the new version takes it all once ready: both at 4
    assert split(advance(straight, 4, 4, 1.0, CFG).rollout, 4) == (1, 4)  # draining: the old keeps one
    with pytest.raises(ValueError, match="done rollout runs one version"):
        shares(RolloutState(Phase.DONE, 100, 0.0))


def test_a_version_never_ready_is_rolled_back_at_the_deadline():
    r = start(0.0)
    assert advance(r, 1, 2, now=599.0, cfg=CFG).rollout is r
    step = advance(r, 1, 2, now=600.0, cfg=CFG)
    assert (step.rollout.phase, step.rollout.new_percent, step.severity) == (Phase.ROLLED_BACK, 0, "critical")
    assert "1 of 2 new pods ready after 600 s" in step.event


def test_abort_goes_back_from_any_phase_and_zero_replicas_go_straight_through():
    canary = advance(start(0.0, 20), 1, 1, 5.0, CFG).rollout
    back = advance(replace(canary, aborted=True), 1, 1, 6.0, CFG).rollout
    assert (back.phase, back.new_percent) == (Phase.ROLLED_BACK, 0)
    assert advance(start(0.0), new_ready=0, replicas=0, now=0.0, cfg=CFG).rollout.phase is Phase.DRAINING
    with pytest.raises(ValueError, match="canary_percent=100"):
        start(0.0, canary_percent=100)
