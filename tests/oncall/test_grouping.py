"""What one problem is (pure): messages that differ only in ids, addresses and numbers fold."""

import random

from controlplane.oncall import grouping


def test_numbers_hex_ids_uuids_and_addresses_are_replaced():
    assert grouping.normalise("probe unanswered for 21.5 s (deadline 20 s), pod ep-7-v1-3") == (
        "probe unanswered for <n> s (deadline <n> s), pod ep-<n>-v<n>-<n>"
    )
    assert (
        grouping.normalise("pod chat-7d9f0c restarted at 0xdeadBEEF") == "pod chat-<hex> restarted at <hex>"
    )
    assert (
        grouping.normalise("request 1b4e28ba-2fa1-11d2-883f-0016d3cca427 failed") == "request <uuid> failed"
    )
    assert grouping.normalise("upstream http://10.0.3.7:8000/v1 refused") == "upstream <url> refused"
    assert grouping.normalise("pod at 10.0.3.7:8001 down") == "pod at <addr> down"
    assert grouping.normalise("  two\n  lines ") == "two lines"


def test_words_that_look_like_hex_but_carry_no_digit_stay():
    assert grouping.normalise("deadbeef accepted a facade") == "deadbeef accepted a facade"


def test_repeats_that_differ_only_in_numbers_share_a_fingerprint_for_many_seeds():
    template = "benchmark of {m} on h100: shape ({i}, {o}) failed after {t:.1f} s, exit code {c}"
    for seed in range(5):
        rng = random.Random(seed)
        prints = {
            grouping.fingerprint(
                "benchmark",
                3,
                grouping.subject(7, "chat", f"bench-{rng.randrange(1000)}"),
                grouping.normalise(
                    template.format(
                        m="llama-3.1-8b",
                        i=rng.randrange(1, 4096),
                        o=rng.randrange(1, 4096),
                        t=rng.uniform(0, 600),
                        c=rng.choice([1, 137, 139]),
                    )
                ),
            )
            for _ in range(50)
        }
        assert len(prints) == 1


def test_another_cause_kind_subject_or_tenant_is_another_problem():
    base = ("restart", 3, grouping.subject(7, "chat", "p"), grouping.normalise("OOMKilled, exit code 137"))
    others = [
        ("restart", 3, base[2], grouping.normalise("Error, exit code 1")),
        ("hang", 3, base[2], base[3]),
        ("restart", 3, grouping.subject(8, "chat", "p"), base[3]),
        ("restart", 4, base[2], base[3]),
    ]
    assert len({grouping.fingerprint(*base), *(grouping.fingerprint(*o) for o in others)}) == 5


def test_the_subject_is_the_endpoint_else_the_pod_else_the_fleet():
    assert grouping.subject(7, "chat", "ep-7-v1-1") == "endpoint:7"
    assert grouping.subject(None, "chat", "ep-7-v1-1") == "endpoint-name:chat"  # the endpoint is gone
    assert grouping.subject(None, "", "bench-3") == "pod:bench"  # a workload's pods are one subject
    assert grouping.subject(None, "", "") == "fleet"


def test_the_sparkline_spans_its_box_with_the_tallest_bucket_at_the_top():
    assert grouping.sparkline([0, 2, 1]) == "16,17 48,1 80,9"
    points = [tuple(map(float, p.split(","))) for p in grouping.sparkline([0] * 23 + [200]).split()]
    assert len(points) == 24 and points[-1][1] == 1 and all(y == 17 for _, y in points[:-1])
    assert grouping.sparkline([0, 0]) == "24,17 72,17"  # nothing happened: a flat line at the bottom
    assert grouping.sparkline([]) == ""


def test_addresses_are_redacted_for_tenants():
    text = "upstream http://10.0.3.7:8000/v1/completions refused; probe 10.0.3.7:8001"
    assert grouping.redact_addresses(text) == "upstream <internal address> refused; probe <internal address>"


def test_a_workloads_pods_are_one_subject_and_other_workloads_another():
    rng = random.Random(6)
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    for _ in range(20):
        pods = [f"ep-7-v1-{rng.randrange(100)}", f"ep-7-v1-{rng.randrange(100, 200)}"]
        assert len({grouping.subject(None, "", p) for p in pods}) == 1, pods
        rs = "".join(rng.choice(alphabet) for _ in range(rng.randrange(6, 11)))
        deployment = [f"chat-{rs}-{''.join(rng.choice(alphabet) for _ in range(5))}" for _ in range(2)]
        assert {grouping.workload(p) for p in deployment} == {"chat"}, deployment
    assert grouping.workload("ep-7-v2-3") != grouping.workload("ep-7-v1-3")  # another version
    assert grouping.workload("ep-8-v1-3") != grouping.workload("ep-7-v1-3")
    assert grouping.workload("chat-proxy") == "chat-proxy"  # an ordinary word is kept


def test_ipv6_and_cluster_host_names_are_redacted_but_not_times_or_words():
    for address in (
        "fd00:10:244::17", "[fd00:10:244::17]:8000", "[fd00:10:244::17]", "::1", "fe80::a1b2:3c4d",
        "2001:db8:0:0:0:0:0:1", "::ffff:10.0.3.7", "chat.default.svc", "chat.default.svc:8000",
        "ep-7.tenant-3.svc.cluster.local", "10-244-1-17.default.pod.cluster.local",
        "ip-10-0-1-17.ec2.internal", "ip-10-0-1-17", "10-244-1-17",
    ):  # fmt: skip
        text = f"peer {address} refused"
        assert grouping.redact_addresses(text) == "peer <internal address> refused", address
    for kept in (
        "at 16:07:30 on 2026-12-01", "std::vector", "dead::beef", "internal error", "the svc is up",
        "ratio 3:1", "pod ep-7-v1-3 restarted", "build a3f9e1b2", "e.g. this",
    ):  # fmt: skip
        assert grouping.redact_addresses(kept) == kept, kept


def test_repeats_from_other_ipv6_pods_and_hosts_are_one_problem():
    texts = [
        f"probe to [fd00:10:244::{i:x}]:8000 failed via ep-7-v1-{i}.tenant-3.svc.cluster.local"
        for i in (7, 23)
    ]
    assert len({grouping.normalise(t) for t in texts}) == 1
    assert "fd00" not in grouping.normalise(texts[0]) and "svc" not in grouping.normalise(texts[0])
