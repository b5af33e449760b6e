"""The tenant's ``cache_salt`` in the body the router forwards (``pod_body``): put in as bytes
after the opening brace when the body is not dumped anyway, combined with a client's own so that
no client value names another tenant's salt, left alone in static mode (no salt)."""

import json

import pytest

from dataplane.router.cache_salt import check_client_salt, salt_member, salted, tenant_salt
from dataplane.router.proxy import pod_body
from dataplane.router.validation import InvalidParameter

ACME = tenant_salt("acme")


def test_a_tenant_salt_is_stable_distinct_and_names_no_tenant():
    assert tenant_salt("acme") == ACME and tenant_salt("globex") != ACME
    assert len(ACME) == 33 and ACME.startswith("t") and "acme" not in ACME
    check_client_salt(ACME)  # what the router sends passes vLLM's rule
    check_client_salt(salted(ACME, "x" * 128))
    assert len(salted(ACME, "x" * 128)) == 66
    assert salt_member("acme") == b'"cache_salt":"%s",' % ACME.encode()


def test_a_body_gets_its_salt_as_bytes_after_the_brace():
    raw = b'{"model": "m", "prompt": "hi"}'
    out, asked, every_chunk = pod_body(raw, json.loads(raw), "acme")
    assert not asked and not every_chunk
    assert out == b'{"cache_salt":"%s","model": "m", "prompt": "hi"}' % ACME.encode()


def test_a_stream_gets_usage_asked_and_its_salt_in_one_insert():
    raw = b' {"model": "m", "prompt": "hi", "stream": true}'
    out, asked, every_chunk = pod_body(raw, json.loads(raw), "acme")
    assert asked and every_chunk
    assert out == (
        b' {"stream_options":{"include_usage":true,"continuous_usage_stats":true},"cache_salt":"%s",'
        b'"model": "m", "prompt": "hi", "stream": true}' % ACME.encode()
    )


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "stream": True, "stream_options": {"include_usage": False}},  # dumped to ask usage
        {"model": "m", "stream": True, "stream_options": {"include_usage": True}},  # dumped: usage each chunk
        {"model": "m", "stream": True, "stream_options": {"include_usage": 1, "continuous_usage_stats": 1}},
        {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "stream_interval": 4},
        {"model": "m", "stream": True, "stream_options": "junk"},  # the engine's to refuse
        {"model": "m", "stream": False},
    ],
)
def test_every_forwarded_body_carries_the_tenant_salt(body):
    raw = json.dumps(body).encode()
    out, _, _ = pod_body(raw, json.loads(raw), "acme")
    assert json.loads(out)["cache_salt"] == ACME
    assert out.count(b'"cache_salt"') == 1


def test_a_body_after_a_byte_order_mark_is_dumped_with_its_salt():
    raw = '\ufeff{"model": "m"}'.encode()
    out, _, _ = pod_body(raw, json.loads(raw), "acme")
    assert json.loads(out) == {"cache_salt": ACME, "model": "m"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_salt_is_combined_with_the_tenant_salt_never_used_alone(stream):
    body = {"model": "m", "cache_salt": "mine", "stream": stream}
    out, _, _ = pod_body(json.dumps(body).encode(), body, "acme")
    sent = json.loads(out)["cache_salt"]
    assert sent == salted(ACME, "mine") and sent.startswith(ACME + ".")
    assert out.count(b'"cache_salt"') == 1  # replaced, not added after (the last would win)
    assert body["cache_salt"] == "mine"  # the client's parsed body is not changed
    # another tenant's salt as the client's own is only a client salt under this tenant
    globex = tenant_salt("globex")
    body = {"model": "m", "cache_salt": globex}
    out, _, _ = pod_body(json.dumps(body).encode(), body, "acme")
    assert json.loads(out)["cache_salt"] == salted(ACME, globex) != globex


def test_a_null_client_salt_is_the_tenant_salt():
    body = {"model": "m", "cache_salt": None}
    out, _, _ = pod_body(json.dumps(body).encode(), body, "acme")
    assert json.loads(out)["cache_salt"] == ACME


def test_static_mode_leaves_the_body_as_it_came():
    raw = b'{"model": "m", "cache_salt": "mine"}'
    assert pod_body(raw, json.loads(raw)) == (raw, False, False)
    raw = b'{"model": "m"}'
    assert pod_body(raw, json.loads(raw)) == (raw, False, False)


@pytest.mark.parametrize("salt", [5, 1.5, True, [], {}, "", "x" * 129, "a/b", "a\\b", "a@b", "a\x00b"])
@pytest.mark.parametrize("tenant", ["acme", None])
def test_a_client_salt_vllm_refuses_is_a_400_naming_it(salt, tenant):
    body = {"model": "m", "cache_salt": salt}
    with pytest.raises(InvalidParameter) as caught:
        pod_body(json.dumps(body).encode(), body, tenant)
    assert caught.value.status == 400 and caught.value.param == "cache_salt"
