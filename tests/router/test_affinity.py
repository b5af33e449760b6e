"""Sticky subsets by rendezvous hashing and the load guard, with worked numbers."""

from collections import Counter

from dataplane.router.affinity import rendezvous_score, rendezvous_subset, subset_is_hot
from dataplane.router.balancer import PodLoad


def fleet(n: int) -> list[PodLoad]:
    return [PodLoad(f"pod-{i}", f"http://127.0.0.1:{9000 + i}") for i in range(n)]


def test_score_is_stable_across_processes():
    # blake2b, not Python's salted hash(): every router replica computes the same subset
    assert rendezvous_score("user-1", "pod-0") == rendezvous_score("user-1", "pod-0")
    assert rendezvous_score("user-1", "pod-0") != rendezvous_score("user-2", "pod-0")


def test_subset_is_k_pods_and_the_same_every_time():
    pods = fleet(8)
    a = rendezvous_subset("session-42", pods, 2)
    assert len(a) == 2
    assert a == rendezvous_subset("session-42", list(reversed(pods)), 2)


def test_subsets_spread_workloads_evenly():
    pods = fleet(8)
    counts = Counter(p.name for w in range(4000) for p in rendezvous_subset(f"w{w}", pods, 2))
    # 4000 workloads x 2 pods / 8 pods = 1000 per pod
    assert all(850 < c < 1150 for c in counts.values())


def test_removing_a_pod_moves_only_the_workloads_that_used_it():
    pods = fleet(8)
    before = {w: {p.name for p in rendezvous_subset(f"w{w}", pods, 2)} for w in range(2000)}
    after = {w: {p.name for p in rendezvous_subset(f"w{w}", pods[:-1], 2)} for w in range(2000)}
    moved = [w for w in before if before[w] != after[w]]
    assert all("pod-7" in before[w] for w in moved)  # nobody else moves
    assert 350 < len(moved) < 650  # about k/n = 2/8 of the workloads


def test_k_at_least_fleet_size_is_the_whole_fleet():
    pods = fleet(2)
    assert rendezvous_subset("w", pods, 2) == pods
    assert rendezvous_subset("w", pods, 0) == pods


def loaded(*mus: float) -> list[PodLoad]:
    out = fleet(len(mus))
    for p, mu in zip(out, mus, strict=True):
        p.inflight_mu = mu
    return out


def test_load_guard_worked_numbers():
    # fleet mean 20 MU, ratio 0.5, abs 10: threshold 1.5 x 20 + 10 = 40
    pods = loaded(40, 45, 0, 0, 0, 0, 15, 15)  # mean 115/8 = 14.4 -> threshold 31.6
    assert subset_is_hot(pods[:2], pods, 0.5, 10.0)
    pods = loaded(40, 50, 10, 10, 10, 10, 15, 15)  # mean 20 -> threshold 40: best 40 stays
    assert not subset_is_hot(pods[:2], pods, 0.5, 10.0)
    pods[0].inflight_mu = 41.0  # mean 20.125 -> threshold 40.19: 41 leaves
    assert subset_is_hot(pods[:2], pods, 0.5, 10.0)


def test_idle_fleet_keeps_stickiness():
    pods = loaded(9, 9, 0, 0)  # mean 4.5 -> threshold 16.75
    assert not subset_is_hot(pods[:2], pods, 0.5, 10.0)


def test_pick_sticky_stays_inside_then_leaves_when_hot():
    import random

    from dataplane.router.affinity import pick_sticky
    from dataplane.router.balancer import pick_p2c_mu

    pods = fleet(6)
    rng = random.Random(0)
    subset = {p.name for p in rendezvous_subset("w", pods, 2)}
    assert all(pick_sticky(pick_p2c_mu, pods, pods, "w", 2, 0.5, 10.0, rng).name in subset for _ in range(50))
    for p in pods:
        if p.name in subset:
            p.inflight_mu = 60.0  # mean 20 -> threshold 40 < 60: hot
    assert all(
        pick_sticky(pick_p2c_mu, pods, pods, "w", 2, 0.5, 10.0, rng).name not in subset for _ in range(50)
    )
    # no workload: the policy over every candidate
    assert pick_sticky(pick_p2c_mu, pods, pods, None, 2, 0.5, 10.0, rng).name not in subset
