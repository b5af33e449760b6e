"""The ``cache_salt`` the router sends to the pods: one prefix cache per tenant. Pure: no I/O.

vLLM's automatic prefix cache is shared by every request a pod serves: a tenant could learn
whether another tenant sent a prompt prefix, from its time to first token and, directly, from
``usage.prompt_tokens_details.cached_tokens`` (which the router prices at a discount). vLLM
0.32 salts a request's cache with its ``cache_salt`` (/v1/completions, /v1/chat/completions):
the salt is an extra key of the hash of the prompt's first block (v1/core/kv_cache_utils.py
``generate_block_hash_extra_keys``), and every later block's hash chains to it, so requests
with different salts share no cached block and requests with the same salt share as without.

So the router salts every request with its tenant's salt (``tenant_salt``): a digest of the
tenant's name, stable across routers and restarts (each router must give a tenant the same
salt, or its requests would miss each other's cache), that does not spell the name out to the
pods or vLLM's KV events (which publish salts). Unkeyed: a pod could test a guessed name against
it, but pods are ours and know the endpoint they serve, and a key would be one more secret every
router must share. Isolation does not rest on the salt being secret: clients cannot reach pods,
and the router sets the salt on every request. A client's own ``cache_salt`` (more isolation inside the
tenant) is kept as a digest after the tenant's part (``salted``): the tenant's part is fixed,
so no client value can name another tenant's salt. In static mode (no keys, no tenants) the
body is left as it is: every request belongs to one party, and a salt would isolate nothing.

vLLM accepts (entrypoints/generate/base/protocol.py ``validate_cache_salt``) an absent or null
salt (no salt), else a non-empty string of at most 128 characters without '@', '/', '\\' or
NUL (``dataplane.wire.cache_salt``, the rule the simulated engine checks too); the router
refuses the rest with a 400 naming ``cache_salt``, as the engine would (``check_client_salt``).
What it sends (33 characters, 66 with a client's) passes that rule.
"""

from __future__ import annotations

import hashlib
from typing import Any

from dataplane.router.validation import InvalidParameter
from dataplane.wire import cache_salt as salt_rule

FIELD = "cache_salt"
_DOMAIN = b"router cache_salt\x00"  # a digest of this purpose only
_HEX = 32  # hex characters of a digest kept: 128 bits


def tenant_salt(tenant: str) -> str:
    """The tenant's salt: "t" and 32 hex characters of a SHA-256 of its name."""
    return "t" + hashlib.sha256(_DOMAIN + tenant.encode("utf-8", "surrogatepass")).hexdigest()[:_HEX]


def salt_member(tenant: str) -> bytes:
    """The tenant's salt as the JSON member the router puts in after a body's opening brace."""
    return b'"cache_salt":"%s",' % tenant_salt(tenant).encode()  # hex: nothing to escape


def check_client_salt(value: Any) -> str | None:
    """A client's ``cache_salt`` as vLLM reads it (None: no salt); a 400 for what it refuses."""
    refused = salt_rule.fault(value)
    if refused == "type":
        raise InvalidParameter(
            FIELD, f"cache_salt must be a non-empty string if provided, got {value!r:.40}", "invalid_type"
        )
    if refused == "content":
        raise InvalidParameter(
            FIELD, "cache_salt must be at most 128 characters and must not contain '@', '/', '\\' or NUL"
        )
    return value  # type: ignore[no-any-return]


def salted(salt: str, client: str | None) -> str:
    """The salt a request of a tenant (``salt``: its ``tenant_salt``) goes out with: the tenant's,
    or with a client's own, the tenant's, a dot and a digest of the client's."""
    if client is None:
        return salt
    return f"{salt}.{hashlib.sha256(client.encode('utf-8', 'surrogatepass')).hexdigest()[:_HEX]}"
