"""vLLM 0.32's rule for a request's ``cache_salt`` (entrypoints/generate/base/protocol.py
``validate_cache_salt``), in one place for the router, which refuses what the engine would, and
the simulated engine, which refuses as vLLM does. Pure.

Absent or null is no salt; else a non-empty string of at most 128 characters without '@', '/',
'\\' or NUL.
"""

from __future__ import annotations

from typing import Any, Literal

MAX_CHARS = 128  # vLLM's _MAX_CACHE_SALT_LENGTH
FORBIDDEN = frozenset("@/\\\x00")  # vLLM's _CACHE_SALT_FORBIDDEN_CHARS


def fault(salt: Any) -> Literal["type", "content"] | None:
    """What vLLM refuses in a salt: "type" (not a non-empty string), "content" (too long, or a
    forbidden character); None when it takes it (None itself: no salt)."""
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        return "type"
    if len(salt) > MAX_CHARS or not FORBIDDEN.isdisjoint(salt):
        return "content"
    return None
