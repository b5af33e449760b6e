"""controlplane.webserver.ConnectionShare: a worker holding more kept-alive connections than the
workers' mean (rounded up) hands one back; at or under it, alone, or without a slot, none."""

from controlplane.webserver import ConnectionShare


def share_of(connections: list[int | None], slot: int) -> ConnectionShare:
    """Workers' slots holding these connections (None: no worker there), seen from `slot`'s."""
    share = ConnectionShare()
    share.allocate(len(connections))
    for i, held in enumerate(connections):
        if held is not None:
            share.join(i)
            share.counts[i] += held
    share.slot = slot
    return share


def test_a_worker_over_the_mean_hands_back_until_it_holds_it():
    share = share_of([13, None, 7], slot=0)
    handed = 0
    while share.hand_back():
        handed += 1
    assert handed == 3  # 10 kept, the mean of 20 between two; the 3 still open count in it
    for _ in range(3):
        share.closed(handed_back=True)
    share.counts[2] += 3  # taken by the other worker
    assert (share.counts[0] - 1, share.counts[2] - 1, share.leaving) == (10, 10, 0)
    assert not share.hand_back()
    assert not share_of([13, None, 7], slot=2).hand_back()


def test_the_mean_is_rounded_up_and_a_lone_worker_keeps_everything():
    assert not share_of([11, 10], slot=0).hand_back()  # 21 between two: 11 is the share
    assert share_of([12, 9], slot=0).hand_back()
    assert not share_of([50], slot=0).hand_back()
    assert not share_of([8, 0, 0], slot=1).hand_back()


def test_a_worker_without_a_slot_counts_nothing_and_keeps_everything():
    share = ConnectionShare()
    share.opened()
    share.closed(handed_back=False)
    assert not share.hand_back()
    share.allocate(4)
    assert share.free_slot([0, 2]) == 1
    share.join(None)
    assert not share.hand_back()


def test_a_worker_gone_is_no_longer_counted():
    share = share_of([4, 30], slot=0)
    assert not share.hand_back()
    share.leave(1)
    assert not share.hand_back()  # alone now
    share.counts[1] = 1  # its replacement joined (in its own process), holding nothing yet
    assert share.hand_back()


def test_a_stopping_worker_leaves_the_counts_at_once():
    share = share_of([0, 12], slot=1)
    assert share.hand_back()  # 12 against a worker holding none
    other = share_of([0, 12], slot=0)
    other.counts = share.counts  # the same shared memory, seen from the worker that stops
    other.depart()
    assert share.counts[0] == 0 and other.slot is None
    assert not share.hand_back()  # alone now: nowhere to hand back to
    other.closed(handed_back=False)  # its connections ending count nowhere
    assert share.counts[0] == 0
