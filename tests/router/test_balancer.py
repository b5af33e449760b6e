"""Balancing policies and pod health with worked numbers (no I/O, seeded randomness)."""

import random
from collections import Counter

import pytest

from dataplane.router.balancer import (
    PodLoad,
    candidates,
    make_policy,
    pick_least_request,
    pick_p2c,
    pick_p2c_mu,
    probe_result,
    record_failure,
    record_success,
)


def pods(*loads: tuple[int, float], tc: int = 0) -> list[PodLoad]:
    out = []
    for i, (req, mu) in enumerate(loads):
        p = PodLoad(f"p{i}", f"http://127.0.0.1:{9000 + i}", tc)
        p.inflight_requests, p.inflight_mu = req, mu
        out.append(p)
    return out


def test_round_robin_cycles_in_order():
    ps = pods((0, 0), (0, 0), (0, 0))
    rr = make_policy("round-robin")
    rng = random.Random(0)
    assert [rr(ps, rng).name for _ in range(6)] == ["p0", "p1", "p2", "p0", "p1", "p2"]


def test_random_is_roughly_uniform():
    ps = pods((0, 0), (0, 0), (0, 0), (0, 0))
    rng = random.Random(1)
    counts = Counter(make_policy("random")(ps, rng).name for _ in range(4000))
    assert all(900 < c < 1100 for c in counts.values())


def test_least_request_picks_fewest_in_flight():
    ps = pods((5, 0), (2, 0), (7, 0))
    assert pick_least_request(ps, random.Random(0)).name == "p1"


def test_p2c_takes_the_less_loaded_of_two_by_requests():
    # with two pods, both are always the sample: (3 req) vs (10 req) -> the first
    ps = pods((3, 60.0), (10, 10.0))
    assert pick_p2c(ps, random.Random(0)).name == "p0"


def test_p2c_mu_takes_the_less_loaded_of_two_by_model_units():
    # 3 long generations (60 MU) are more work than 10 short ones (10 MU): p2c-mu sees it
    ps = pods((3, 60.0), (10, 10.0))
    assert pick_p2c_mu(ps, random.Random(0)).name == "p1"


def test_p2c_mu_ties_on_mu_break_on_requests():
    ps = pods((4, 5.0), (2, 5.0))
    assert pick_p2c_mu(ps, random.Random(0)).name == "p1"


def test_p2c_mu_never_picks_the_most_loaded_of_three():
    ps = pods((0, 1.0), (0, 2.0), (0, 50.0))
    rng = random.Random(3)
    picked = Counter(pick_p2c_mu(ps, rng).name for _ in range(3000))
    assert picked["p2"] == 0
    # p0 wins every pair it is in: P = 2/3; p1 only the pair (p1, p2): 1/3
    assert picked["p0"] == pytest.approx(2000, rel=0.06)


def test_candidates_respect_target_concurrency_readiness_and_ejection():
    ps = pods((7, 0), (8, 0), (0, 0), (0, 0), tc=8)
    ps[2].ready = False
    ps[3].ejected = True
    assert [p.name for p in candidates(ps)] == ["p0"]  # 7 of 8 has room, 8 of 8 does not
    assert candidates(ps, exclude=[ps[0]]) == []


def test_unlimited_target_concurrency_means_always_room():
    p = PodLoad("p", "http://x:1", target_concurrency=0)
    p.inflight_requests = 10_000
    assert p.has_room()


def test_acquire_release_returns_to_exact_zero():
    p = PodLoad("p", "http://x:1")
    for c in (0.1, 0.2, 0.7):
        p.acquire(c)
    for c in (0.1, 0.2, 0.7):
        p.release(c)
    assert (p.inflight_requests, p.inflight_mu) == (0, 0.0)


def test_unknown_policy_names_the_bad_value():
    with pytest.raises(ValueError, match="'fastest'"):
        make_policy("fastest")


def test_ejection_after_three_failures_and_backoff_doubling():
    p = PodLoad("p", "http://x:1")
    assert not record_failure(p, 10.0, 3, 1.0)
    record_success(p)  # a success in between resets the streak
    assert not record_failure(p, 10.0, 3, 1.0)
    assert not record_failure(p, 10.1, 3, 1.0)
    assert record_failure(p, 10.2, 3, 1.0)
    assert p.ejected and p.probe_due_at == pytest.approx(11.2)
    probe_result(p, False, 11.2, 1.0, 30.0)
    assert p.probe_due_at == pytest.approx(13.2)  # 2 s
    probe_result(p, False, 13.2, 1.0, 30.0)
    assert p.probe_due_at == pytest.approx(17.2)  # 4 s
    for _ in range(10):
        probe_result(p, False, 100.0, 1.0, 30.0)
    assert p.probe_due_at == pytest.approx(130.0)  # capped at 30 s
    probe_result(p, True, 131.0, 1.0, 30.0)
    assert not p.ejected and p.consecutive_failures == 0 and p.available()


def test_p2c_mu_counts_what_a_pod_has_not_begun_to_answer_twice():
    # 60 MU in flight, 50 of it not answered yet (a prompt prefilling): load 110; 90 MU all
    # streaming their answers: 90. By in-flight MU the first is lighter; for a new request's
    # first token, which waits behind the prompts, the second is.
    prefilling, streaming = pods((3, 60.0), (3, 90.0))
    prefilling.unanswered_mu = 50.0
    assert (prefilling.load_mu(), streaming.load_mu()) == (110.0, 90.0)
    assert pick_p2c_mu([prefilling, streaming], random.Random(0)) is streaming


def test_a_request_counts_as_unanswered_until_its_first_byte():
    p = PodLoad("p", "http://x:1")
    p.acquire(2.0)
    p.acquire(3.0)
    assert (p.inflight_mu, p.unanswered_mu, p.load_mu()) == (5.0, 5.0, 10.0)
    p.answering(3.0)  # its first token came
    assert p.load_mu() == 7.0
    p.release(3.0)  # answered before
    p.release(2.0, answered=False)  # failed (or refused) before any byte
    assert (p.inflight_requests, p.inflight_mu, p.unanswered_mu) == (0, 0.0, 0.0)
