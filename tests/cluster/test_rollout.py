"""The rollout phases on synthetic time, with the worked numbers of dataplane.cluster.rollout."""

import pytest

from dataplane.cluster.rollout import Phase, RolloutConfig, advance, start

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


def test_a_canary_holds_its_share_until_promoted():
    r = advance(start(0.0, canary_percent=10), new_ready=3, replicas=3, now=20.0, cfg=CFG).rollout
    assert (r.phase, r.new_percent) == (Phase.CANARY, 10)
    assert advance(r, 3, 3, now=5000.0, cfg=CFG).rollout is r  # no deadline once serving
    from dataclasses import replace

    step = advance(replace(r, promoted=True), 3, 3, now=6000.0, cfg=CFG)
    assert (step.rollout.phase, step.rollout.new_percent) == (Phase.DRAINING, 100)


def test_a_version_never_ready_is_rolled_back_at_the_deadline():
    r = start(0.0)
    assert advance(r, 1, 2, now=599.0, cfg=CFG).rollout is r
    step = advance(r, 1, 2, now=600.0, cfg=CFG)
    assert (step.rollout.phase, step.rollout.new_percent) == (Phase.ROLLED_BACK, 0)
    assert "1 of 2 new pods ready after 600 s" in step.event


def test_abort_goes_back_from_any_phase_and_zero_replicas_go_straight_through():
    from dataclasses import replace

    canary = advance(start(0.0, 20), 1, 1, 5.0, CFG).rollout
    back = advance(replace(canary, aborted=True), 1, 1, 6.0, CFG).rollout
    assert (back.phase, back.new_percent) == (Phase.ROLLED_BACK, 0)
    assert advance(start(0.0), new_ready=0, replicas=0, now=0.0, cfg=CFG).rollout.phase is Phase.DRAINING
    with pytest.raises(ValueError, match="canary_percent=100"):
        start(0.0, canary_percent=100)
