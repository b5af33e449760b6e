"""Whole replicas on real nodes (capacity/packing/): worked numbers, then generated pools.

The generated pools are checked against a brute-force search written here (every replica to
every node or to nowhere), not against the module's own exact programme alone.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity.packing import (
    EXACT_WORK,
    Move,
    NodeShape,
    Packing,
    ReplicaDemand,
    _simplex_max,
    check_change,
    defrag_plan,
    exact_work,
    gpus_bound,
    pack,
    pack_exact,
    pack_heuristic,
    replicas_needed,
)

EIGHT = NodeShape(gpus=8)


def demand(
    key: str, gpus: int, count: int = 1, model: str = "m", memory_mib: int | None = None
) -> ReplicaDemand:
    return ReplicaDemand(key=key, model=model, gpus=gpus, count=count, memory_mib=memory_mib)


# -- worked numbers ---------------------------------------------------------------------------


def test_replicas_are_whole_ten_tenants_of_half_a_replica_need_ten():
    # 10 endpoints x 50 MU/min of a 4-GPU, 100-MU/min-per-replica model: 10 replicas, 40 GPUs (not 20).
    counts = [replicas_needed(50, 100, 0) for _ in range(10)]
    assert counts == [1] * 10
    packing = pack(5, EIGHT, [demand(f"t{i}", 4, c) for i, c in enumerate(counts)])
    assert packing.fits and packing.used_gpus == 40 and packing.free_gpus == 0
    # On 4 nodes (32 GPUs, more than the 20 a real-number ledger counts) they do not fit.
    assert not check_change(4, EIGHT, [demand(f"t{i}", 4) for i in range(9)], demand("t9", 4)).fits


@pytest.mark.parametrize(
    ("reserved", "per_replica", "minimum", "expected"),
    [
        (50, 100, 0, 1),
        (200, 100, 0, 2),
        (201, 100, 0, 3),
        (0, 100, 0, 0),
        (0, 100, 2, 2),
        (300, 100, 1, 3),
        (100, 100, 3, 3),
        (Fraction(1, 3), 100, 0, 1),
        (Fraction(100), 100, 0, 1),
    ],
)
def test_replicas_needed_is_the_ceiling_at_least_the_minimum(reserved, per_replica, minimum, expected):
    assert replicas_needed(reserved, per_replica, minimum) == expected


def test_replicas_needed_refuses_floats_and_bad_values():
    with pytest.raises(TypeError, match="float"):
        replicas_needed(0.1, 100, 0)
    with pytest.raises(ValueError, match="reserved_mu_per_minute"):
        replicas_needed(-1, 100, 0)
    with pytest.raises(ValueError, match="mu_per_replica_minute"):
        replicas_needed(50, 0, 0)
    with pytest.raises(ValueError, match="min_replicas"):
        replicas_needed(50, 100, -1)


def test_two_nodes_of_eight_hold_two_five_gpu_replicas_not_three():
    assert pack(2, EIGHT, [demand("a", 5, 2)]).fits
    packing = pack(2, EIGHT, [demand("a", 5, 3)])
    assert not packing.fits
    assert packing.unplaced == (demand("a", 5, 1),)
    assert packing.free_per_node == (3, 3)
    assert packing.stranded_gpus([5]) == 6
    assert packing.more_fit(5) == 0 and packing.more_fit(3) == 2


def test_contract_sale_check_16_gpus_5_gpu_replicas():
    # 200 MU/min at 100 per replica -> 2 replicas fit; 300 -> 3 do not, and 2 of them fit.
    two = check_change(2, EIGHT, [], demand("e", 5, replicas_needed(200, 100, 0)))
    assert two.fits and two.fit_replicas == 2
    three = check_change(2, EIGHT, [], demand("e", 5, replicas_needed(300, 100, 0)))
    assert not three.fits
    assert (three.asked_replicas, three.asked_gpus_per_replica, three.fit_replicas) == (3, 5, 2)
    assert three.message("h100") == "pool 'h100': 3 replicas of 5 GPUs asked for 'e', 2 fit"
    # Two endpoints of 50 MU/min each: two replicas, 10 GPUs.
    x, y = (demand(k, 5, replicas_needed(50, 100, 0)) for k in "xy")
    both = pack(2, EIGHT, [x, y])
    assert both.fits and both.used_gpus == 10


def test_check_change_replaces_the_endpoints_demand():
    # a holds 2 x 5 GPUs on 2 nodes; changing a to 1 replica frees room, b's 5-GPU replica fits.
    demands = [demand("a", 5, 2)]
    assert not check_change(2, EIGHT, demands, demand("b", 5)).fits
    assert check_change(2, EIGHT, [demand("a", 5, 1), demand("b", 5)], demand("a", 5, 1)).fits
    shrink = check_change(2, EIGHT, [*demands, demand("b", 3, 2)], demand("a", 5, 1))
    assert shrink.fits and shrink.packing.replicas_of("a") == 1


def test_check_change_counts_memory_where_the_node_limits_it():
    # 2 nodes x 8 GPUs x 640 GiB; a 2-GPU replica needing 300 GiB: 2 per node by memory, not 4.
    shape = NodeShape(8, memory_mib=640 * 1024)
    verdict = check_change(2, shape, [], demand("a", 2, 5, memory_mib=300 * 1024))
    assert not verdict.fits and verdict.fit_replicas == 4
    assert verdict.packing.unplaced_replicas == 1 and verdict.packing.free_per_node == (4, 4)
    assert check_change(2, shape, [], demand("a", 2, 4, memory_mib=300 * 1024)).fits


def test_check_change_when_the_rest_already_does_not_fit():
    # After a pool shrink the others alone overfill it: nothing of the change fits.
    verdict = check_change(1, EIGHT, [demand("a", 8, 2)], demand("b", 1, 3))
    assert not verdict.fits and verdict.fit_replicas == 0


def test_mixed_tp_sizes_pack_and_leave_one_half_node():
    # 4 nodes x 8: TP8 x1, TP4 x3, TP2 x3, TP1 x2 = 28 GPUs: three full nodes and one with 4 free.
    demands = [demand("tp8", 8), demand("tp4", 4, 3), demand("tp2", 2, 3), demand("tp1", 1, 2)]
    packing = pack(4, EIGHT, demands)
    assert packing.fits
    assert packing.free_per_node == (0, 0, 0, 4)
    assert packing.more_fit(4) == 1 and packing.more_fit(8) == 0 and packing.more_fit(1) == 4
    assert packing.stranded_gpus([8]) == 4
    assert packing.stranded_gpus([4, 8]) == 0
    assert packing.stranded_gpus([3]) == 1
    assert packing.stranded_gpus([]) == 4


def test_fragmentation_strands_free_gpus_that_a_larger_replica_cannot_use():
    # Six 3-GPU replicas on 3 x 8 GPUs: 2 free on each node, 6 free in all, and no 4-GPU replica fits.
    packing = pack(3, EIGHT, [demand("a", 3, 6)])
    assert packing.free_per_node == (2, 2, 2)
    assert packing.stranded_gpus([3, 4]) == 6 and packing.stranded_gpus([2]) == 0
    assert packing.more_fit(2) == 3 and packing.more_fit(4) == 0
    verdict = check_change(3, EIGHT, [demand("a", 3, 6)], demand("b", 4))
    assert not verdict.fits and verdict.fit_replicas == 0


def test_a_replica_larger_than_a_node_never_fits():
    packing = pack(4, EIGHT, [demand("big", 16)])
    assert not packing.fits and packing.unplaced == (demand("big", 16),) and packing.free_gpus == 32


def test_memory_limits_a_node_as_gpus_do():
    # 8 GPUs and 640 GiB per node; 1-GPU replicas of 200 GiB: 3 per node, not 8.
    shape = NodeShape(8, memory_mib=640 * 1024)
    packing = pack(2, shape, [demand("a", 1, 7, memory_mib=200 * 1024)])
    assert not packing.fits and packing.unplaced_replicas == 1
    assert packing.free_per_node == (5, 5)
    assert packing.more_fit(1, memory_mib=40 * 1024) == 2  # 40 GiB left on each node
    # A shape without a memory limit ignores the replicas' memory.
    assert pack(2, EIGHT, [demand("a", 1, 7, memory_mib=200 * 1024)]).fits


def test_memory_is_counted_in_64ths_of_a_node_rounded_up():
    # 640 GiB nodes: 100 GiB is 10/64, 101 GiB is 11/64. Three replicas of 211 GiB (633 GiB) fit
    # in MiB but take 3 x 22/64 > 1 node: the packer refuses them (it never overfills a node);
    # three of 210 GiB are 3 x 21/64 and fit. The price of counting: < 1/64 node per replica.
    shape = NodeShape(8, memory_mib=640 * 1024)
    assert shape.grains(1, memory_mib=100 * 1024) == (1, 10)
    assert shape.grains(1, memory_mib=101 * 1024) == (1, 11)
    assert shape.grains(1, memory_mib=700 * 1024)[1] > 64
    assert pack(1, shape, [demand("a", 1, 3, memory_mib=210 * 1024)]).fits
    assert not pack(1, shape, [demand("a", 1, 3, memory_mib=211 * 1024)]).fits
    assert pack(1, shape, [demand("a", 1, 3, memory_mib=210 * 1024)]).free_resources == ((5, 10 * 1024),)
    # A dimension the node has none of: only replicas that need none of it fit.
    cpu_less = NodeShape(8, cpu_millicores=0)
    assert pack(1, cpu_less, [ReplicaDemand("a", "m", 1, 1)]).fits
    assert not pack(1, cpu_less, [ReplicaDemand("a", "m", 1, 1, cpu_millicores=1)]).fits


@pytest.mark.parametrize(
    ("sizes", "weights"),
    [
        ((1, 2, 4, 8), (8, 4, 2, 1)),
        (tuple(range(1, 9)), (1,) * 8),
        ((3, 5, 6, 7), (1,) * 4),
        ((5, 3, 2, 1), (4, 2, 2, 1)),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overfull_large_pools_place_nearly_the_lp_bound(sizes, weights, seed):
    # 64 nodes, 15 % more GPUs asked than there are: beyond the exact programme's reach, the
    # heuristics and the rounded LP place >= 98 % of what the LP bounds any packing to.
    rng = random.Random(seed)
    demands = []
    while sum(d.gpus * d.count for d in demands) < 1.15 * 64 * 8:
        demands.append(demand(f"ep{len(demands)}", rng.choices(sizes, weights)[0], rng.randint(1, 3)))
    assert exact_work(64, EIGHT, demands) > EXACT_WORK
    packing = pack(64, EIGHT, demands)
    bound = gpus_bound(64, EIGHT, demands)
    assert bound is not None and packing.used_gpus <= bound
    assert packing.used_gpus >= 0.98 * bound
    if sizes == (1, 2, 4, 8):
        assert packing.used_gpus == 64 * 8  # divisible sizes: every node full


def test_placement_is_independent_of_input_order():
    rng = random.Random(7)
    demands = [demand(f"ep{i}", rng.choice((1, 2, 4, 8)), rng.randint(0, 3)) for i in range(60)]
    first = pack(20, EIGHT, demands)
    for _ in range(5):
        rng.shuffle(demands)
        assert pack(20, EIGHT, demands) == first


def test_what_is_left_is_counted_without_naming_the_replicas():
    # A pool's stored figures read what is free, what fits and what is left out: the names go
    # on when the nodes are first read, and are then the same as had they gone on at once.
    rng = random.Random(11)
    demands = [demand(f"ep{i}", rng.choice((1, 2, 4, 8)), rng.randint(0, 3)) for i in range(120)]
    packing = pack(30, EIGHT, demands)
    figures = (packing.nodes, packing.free_gpus, packing.more_fit(4), packing.stranded_gpus([4, 8]))
    assert (packing.unplaced_replicas, packing.fits) == (sum(d.count for d in packing.unplaced), False)
    assert not packing.placed.named and figures[0] == 30
    nodes = list(packing.placed)
    assert packing.placed.named
    assert packing.used_gpus == sum(r.gpus for node in nodes for r in node) == 30 * 8 - figures[1]
    assert [8 - sum(r.gpus for r in node) for node in nodes] == list(packing.free_per_node)
    assert packing.placed == tuple(nodes) and hash(packing.placed) == hash(tuple(nodes))


def test_placed_names_go_in_key_order_largest_replicas_first():
    packing = pack(2, EIGHT, [demand("b", 2), demand("a", 2), demand("c", 4)])
    assert [[(r.key, r.gpus) for r in node] for node in packing.placed] == [
        [("c", 4), ("a", 2), ("b", 2)],
        [],
    ]


def test_bad_demands_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="gpus"):
        ReplicaDemand("a", "m", 0, 1)
    with pytest.raises(ValueError, match="count"):
        ReplicaDemand("a", "m", 1, -1)
    with pytest.raises(ValueError, match="gpus"):
        NodeShape(0)
    with pytest.raises(ValueError, match="nodes"):
        pack(-1, EIGHT, [])
    with pytest.raises(ValueError, match="'a'"):
        pack(1, EIGHT, [demand("a", 1), demand("a", 2)])


def test_defrag_plan_moves_a_half_node_to_free_a_whole_one():
    # As the cluster placed them: a 4-GPU replica on each of 2 nodes; an 8-GPU replica wanted.
    demands = [demand("a", 4), demand("b", 4)]
    plan = defrag_plan(2, EIGHT, demands, demand("w", 8), placed=[["a"], ["b"]])
    assert plan == [Move(key="a", gpus=4, from_node=0, to_node=1)]
    # As pack() places them the two share a node already: nothing to move.
    assert defrag_plan(2, EIGHT, demands, demand("w", 8)) == []
    # Two 8-GPU replicas need 16 free GPUs, there are 8: no plan.
    assert defrag_plan(2, EIGHT, demands, demand("w", 8, 2), placed=[["a"], ["b"]]) is None


def test_defrag_plan_picks_the_fewest_moves():
    # Node 0 holds 2+1, node 1 holds 4+2, node 2 holds 2+1 (12 of 24 GPUs used); one 8 wanted:
    # emptying node 0 or node 2 takes two moves, node 1 two moves of more GPUs: node 0.
    demands = [demand("a", 2, 3), demand("b", 4), demand("c", 1, 2)]
    plan = defrag_plan(3, EIGHT, demands, demand("w", 8), placed=[["a", "c"], ["b", "a"], ["a", "c"]])
    assert plan is not None and len(plan) == 2
    assert {m.from_node for m in plan} == {0}
    assert_plan_makes_room(EIGHT, demands, [["a", "c"], ["b", "a"], ["a", "c"]], plan, demand("w", 8))


def test_defrag_plan_refuses_a_placement_it_cannot_read():
    with pytest.raises(ValueError, match="'zz'"):
        defrag_plan(1, EIGHT, [demand("a", 4)], demand("w", 4), placed=[["zz"]])
    with pytest.raises(ValueError, match="node 0"):
        defrag_plan(1, EIGHT, [demand("a", 6, 2)], demand("w", 4), placed=[["a", "a"]])
    with pytest.raises(ValueError, match="2 nodes"):
        defrag_plan(1, EIGHT, [demand("a", 4)], demand("w", 4), placed=[["a"], []])


@pytest.mark.parametrize(
    ("gain", "rows", "bounds", "expected"),
    [
        # max 3x + 2y: x + y <= 4, x + 3y <= 6 -> x = 4, y = 0
        ([3.0, 2.0], [[1.0, 1.0], [1.0, 3.0]], [4.0, 6.0], [4.0, 0.0]),
        # max x + y: x + 2y <= 4, 3x + y <= 6 -> x = 1.6, y = 1.2
        ([1.0, 1.0], [[1.0, 2.0], [3.0, 1.0]], [4.0, 6.0], [1.6, 1.2]),
        # degenerate: a zero bound
        ([1.0, 1.0], [[1.0, 1.0], [1.0, 0.0]], [0.0, 5.0], [0.0, 0.0]),
    ],
)
def test_the_configuration_lp_simplex_on_worked_programmes(gain, rows, bounds, expected):
    assert _simplex_max(gain, rows, bounds) == pytest.approx(expected)


def test_a_large_fleet_packs_validly():
    # 1,000 nodes x 8 GPUs, 5,000 endpoints of TP 1/2/4/8 (speed: bench/packing.py).
    rng = random.Random(3)
    sizes = rng.choices((1, 2, 4, 8), (80, 12, 5, 3), k=5000)
    demands = [demand(f"ep{i}", g) for i, g in enumerate(sizes)]
    packing = pack(1000, EIGHT, demands)
    assert packing.fits and packing.used_gpus == sum(sizes)
    assert_valid(packing, demands)
    # Sizes that divide each other and the node: nothing is stranded for the smallest.
    assert packing.stranded_gpus([1]) == 0


# -- generated pools --------------------------------------------------------------------------


def assert_valid(packing: Packing, demands: list[ReplicaDemand]) -> None:
    shape = packing.shape
    kinds = {d.key: shape.kind(d.gpus, d.cpu_millicores, d.memory_mib) for d in demands}
    by_key = {d.key: d for d in demands}
    placed: Counter[str] = Counter()
    for node, free, free_all in zip(
        packing.placed, packing.free_per_node, packing.free_resources, strict=True
    ):
        used = [sum(kinds[r.key][i] for r in node) for i in range(len(shape.capacity))]
        assert all(u + f == c and f >= 0 for u, f, c in zip(used, free_all, shape.capacity, strict=True))
        assert free == free_all[0]
        for r in node:
            assert r.gpus == by_key[r.key].gpus  # a whole replica, all its GPUs on this node
            placed[r.key] += 1
    left = {d.key: d.count for d in packing.unplaced}
    assert all(d.count > 0 for d in packing.unplaced)
    assert all(placed[d.key] + left.get(d.key, 0) == d.count for d in demands)
    assert packing.fits == (not packing.unplaced)


def brute_force_gpus(nodes: int, capacity: int, sizes: list[int]) -> int:
    """The most GPUs any assignment of the replicas (each to a node or to nowhere) places."""

    @functools.cache
    def best(i: int, fills: tuple[int, ...]) -> int:
        if i == len(sizes):
            return 0
        out = best(i + 1, fills)  # left out
        for f in set(fills):
            if f + sizes[i] <= capacity:
                j = fills.index(f)
                after = tuple(sorted((*fills[:j], f + sizes[i], *fills[j + 1 :])))
                out = max(out, sizes[i] + best(i + 1, after))
        return out

    return best(0, (0,) * nodes)


ANY_SIZE = st.integers(1, 9)  # 9: a replica larger than any node here
ANY_NODE = st.integers(1, 8)


@st.composite
def pools(draw, sizes=ANY_SIZE, max_endpoints=6, max_count=3, gpus=ANY_NODE):
    node_gpus = draw(gpus)
    shape = NodeShape(node_gpus)
    n = draw(st.integers(0, max_endpoints))
    demands = [demand(f"e{i}", draw(sizes), draw(st.integers(0, max_count))) for i in range(n)]
    return draw(st.integers(0, 4)), shape, demands


@settings(max_examples=100, deadline=None)
@given(pools())
def test_every_packing_is_valid(pool):
    nodes, shape, demands = pool
    for packer in (pack, pack_heuristic, pack_exact):
        assert_valid(packer(nodes, shape, demands), demands)


@settings(max_examples=60, deadline=None)
@given(pools(), st.integers(1, 1000), st.data())
def test_every_packing_is_valid_with_memory(pool, node_memory, data):
    nodes, shape, demands = pool
    shape = NodeShape(shape.gpus, memory_mib=node_memory)
    demands = [
        demand(d.key, d.gpus, d.count, memory_mib=data.draw(st.none() | st.integers(0, 600))) for d in demands
    ]
    for packer in (pack, pack_heuristic):
        assert_valid(packer(nodes, shape, demands), demands)
    # What more_fit promises, a sale check grants (both count memory as the packer does).
    packing = pack(nodes, shape, demands)
    gpus, memory = data.draw(st.integers(1, 8)), data.draw(st.integers(0, 600))
    if packing.fits:
        more = packing.more_fit(gpus, memory_mib=memory)
        assert check_change(nodes, shape, demands, demand("more", gpus, more, memory_mib=memory)).fits


@settings(max_examples=80, deadline=None)
@given(pools(max_endpoints=4, max_count=2), st.data())
def test_exact_and_pack_place_what_brute_force_does(pool, data):
    nodes, shape, demands = pool
    sizes = sorted((d.gpus for d in demands for _ in range(d.count)), reverse=True)
    optimum = brute_force_gpus(nodes, shape.gpus, sizes)
    assert pack_exact(nodes, shape, demands).used_gpus == optimum
    if exact_work(nodes, shape, demands) <= EXACT_WORK:
        assert pack(nodes, shape, demands).used_gpus == optimum
    heuristic = pack_heuristic(nodes, shape, demands)
    assert heuristic.used_gpus <= optimum


@settings(max_examples=80, deadline=None)
@given(pools(sizes=st.sampled_from((1, 2, 4, 8)), max_endpoints=8, max_count=4, gpus=st.just(8)))
def test_heuristic_and_exact_agree_when_sizes_divide_the_node(pool):
    # TP 1, 2, 4, 8 on 8-GPU nodes: best-fit decreasing is optimal (divisible sizes).
    nodes, shape, demands = pool
    heuristic = pack_heuristic(nodes, shape, demands)
    exact = pack_exact(nodes, shape, demands)
    assert heuristic.used_gpus == exact.used_gpus and heuristic.fits == exact.fits
    assert heuristic.used_gpus == min(sum(d.gpus * d.count for d in demands), nodes * 8)


@settings(max_examples=60, deadline=None)
@given(pools(max_endpoints=5), st.randoms(use_true_random=False))
def test_same_pool_any_order_same_packing(pool, rnd):
    nodes, shape, demands = pool
    shuffled = list(demands)
    rnd.shuffle(shuffled)
    assert pack(nodes, shape, shuffled) == pack(nodes, shape, demands)


@settings(max_examples=60, deadline=None)
@given(pools(max_endpoints=4), st.integers(1, 8), st.integers(0, 5))
def test_check_change_fit_replicas_is_the_most_that_packs(pool, gpus, count):
    nodes, shape, demands = pool
    change = demand("changed", gpus, count)
    verdict = check_change(nodes, shape, demands, change)
    assert verdict.fits == pack(nodes, shape, [*demands, change]).fits
    if verdict.fits:
        assert verdict.fit_replicas == count
    elif pack(nodes, shape, demands).fits and exact_work(nodes, shape, [*demands, change]) <= EXACT_WORK:
        fit = verdict.fit_replicas
        assert pack(nodes, shape, [*demands, demand("changed", gpus, fit)]).fits
        assert not pack(nodes, shape, [*demands, demand("changed", gpus, fit + 1)]).fits


@settings(max_examples=100, deadline=None)
@given(pools(max_endpoints=5), st.integers(1, 8))
def test_more_fit_replicas_do_fit(pool, gpus):
    nodes, shape, demands = pool
    packing = pack(nodes, shape, demands)
    if packing.fits:
        more = packing.more_fit(gpus)
        assert check_change(nodes, shape, demands, demand("more", gpus, more)).fits
        assert more * gpus + packing.stranded_gpus([gpus]) <= packing.free_gpus


def assert_plan_makes_room(
    shape: NodeShape,
    demands: list[ReplicaDemand],
    placed: list[list[str]],
    plan: list[Move],
    wanted: ReplicaDemand,
) -> None:
    gpus = {d.key: d.gpus for d in demands}
    nodes = [list(keys) for keys in placed]
    for move in plan:
        assert move.key in nodes[move.from_node] and move.gpus == gpus[move.key]
        nodes[move.from_node].remove(move.key)
        nodes[move.to_node].append(move.key)
        assert sum(gpus[k] for k in nodes[move.to_node]) <= shape.gpus
    room = sum((shape.gpus - sum(gpus[k] for k in keys)) // wanted.gpus for keys in nodes)
    assert room >= wanted.count


@settings(max_examples=100, deadline=None)
@given(pools(sizes=st.integers(1, 8), max_endpoints=6), st.integers(1, 8), st.integers(1, 2), st.randoms())
def test_a_defrag_plan_makes_room_for_what_is_wanted(pool, gpus, count, rnd):
    nodes, shape, demands = pool
    packing = pack(nodes, shape, demands)
    # A scattered placement of what fits, as a cluster might have it.
    placed: list[list[str]] = [[] for _ in range(nodes)]
    free = [shape.gpus] * nodes
    for d in demands:
        for _ in range(packing.replicas_of(d.key)):
            options = [n for n in range(nodes) if free[n] >= d.gpus]
            if options:
                n = rnd.choice(options)
                placed[n].append(d.key)
                free[n] -= d.gpus
    wanted = demand("w", gpus, count)
    plan = defrag_plan(nodes, shape, demands, wanted, placed=placed)
    as_placed = sum(f // gpus for f in free)
    if as_placed >= count:
        assert plan == []
    elif plan is not None:
        assert plan and len(plan) <= 16
        assert_plan_makes_room(shape, demands, placed, plan, wanted)


def test_a_refused_check_solves_the_lp_once_whatever_the_sizes(monkeypatch):
    # 16-GPU nodes, 16 replica sizes: 900-odd node contents, a simplex of ~20 ms; one per
    # bisection step made a refused check take seconds under the pool's locks (review).
    import capacity.packing.solver as solver  # where the LP rounding calls the simplex

    solves = []
    real = solver._simplex_max
    monkeypatch.setattr(solver, "_simplex_max", lambda *a: solves.append(1) or real(*a))
    rng = random.Random(1)
    sixteen = NodeShape(gpus=16)
    demands = [demand(f"e{i}", rng.randint(1, 16), rng.randint(0, 3)) for i in range(180)]
    free = 300 * 16 - sum(d.gpus * d.count for d in demands)
    verdict = check_change(300, sixteen, demands, demand("x", 9, free // 9 + 1))
    assert not verdict.fits and 0 < verdict.fit_replicas < free // 9 + 1
    assert len(solves) == 1
    # What it says fits does fit.
    assert check_change(300, sixteen, demands, demand("x", 9, verdict.fit_replicas)).fits


def test_the_simplex_gives_up_past_its_work_bound(monkeypatch):
    import capacity.packing.simplex as simplex

    gain, rows, bounds = [3.0, 2.0], [[1.0, 1.0], [1.0, 3.0]], [4.0, 6.0]
    assert _simplex_max(gain, rows, bounds) == pytest.approx([4.0, 0.0])
    monkeypatch.setattr(simplex, "LP_WORK", 0)  # one pivot: not enough for the optimum here
    assert _simplex_max(gain, rows, bounds) is None
