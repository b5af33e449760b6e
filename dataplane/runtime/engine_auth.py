"""The fleet credential as an engine checks it: vLLM's ``--api-key`` guard, for the simulated engine.

vLLM (vllm/entrypoints/serve/middleware/authenticate.py, installed by ``build_app`` when
``--api-key`` or ``$VLLM_API_KEY`` is set) answers 401 ``{"error": "Unauthorized"}`` to a
request without ``Authorization: Bearer <one of its keys>`` on every path but its public
ones (health, load and version probes, metrics scraping, the API docs). The keys come from
``--api-key K [K ...]`` or else ``$VLLM_API_KEY``, which is one key (vLLM does not split it).
Keys are compared by SHA-256 digest in constant time, as vLLM does. Pure logic, no I/O.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Mapping

ENV_VARIABLE = "VLLM_API_KEY"
# vLLM's PUBLIC_ENDPOINTS that the simulated engine serves or could (the docs it has not).
PUBLIC_PATHS = ("/health", "/ping", "/load", "/version", "/metrics")
UNAUTHORIZED_BODY = {"error": "Unauthorized"}


def engine_keys(flag_keys: Iterable[str] | None, env: Mapping[str, str]) -> list[str]:
    """The keys an engine accepts: ``--api-key``'s, else ``$VLLM_API_KEY`` (one key); empty
    strings dropped. Empty list: no guard, as vLLM without a key."""
    keys = list(flag_keys) if flag_keys else [env.get(ENV_VARIABLE, "")]
    return [key for key in keys if key]


def digests(keys: Iterable[str]) -> list[bytes]:
    return [hashlib.sha256(key.encode()).digest() for key in keys]


def is_public(path: str) -> bool:
    """Exact or on a segment boundary: /healthcheck is not /health."""
    return any(path == public or path.startswith(public + "/") for public in PUBLIC_PATHS)


def authorized(authorization: str | None, key_digests: list[bytes]) -> bool:
    """Whether an Authorization header's bearer token is one of the keys."""
    if not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    digest = hashlib.sha256(token.encode()).digest()
    match = False
    for known in key_digests:  # every key compared: the time says nothing of which matched
        match |= secrets.compare_digest(digest, known)
    return match


def bearer(key: str) -> dict[str, str]:
    """The header a client of a keyed engine sends (none without a key)."""
    return {"authorization": f"Bearer {key}"} if key else {}
