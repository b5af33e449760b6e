"""The prompt-side details of an engine's usage object, read from its bytes: the prompt tokens
the prefix cache held and those its images took. Pure; no I/O.

vLLM reports them with --enable-prompt-tokens-details (entrypoints/serve/engine/protocol.py
PromptTokenUsageInfo), after the counts the router already reads:

    "usage":{"prompt_tokens":1300,"total_tokens":1316,"completion_tokens":16,
             "prompt_tokens_details":{"cached_tokens":1024,"multimodal_tokens":{"image":256}}}

-> (1024, 256). Without the field (or with ``null``) -> (0, 0): nothing cached, no image tokens
said (the router's own image count prices them then). Keys are matched as keys: inside a JSON
string every quote is escaped, so a generated "cached_tokens" never matches.
"""

from __future__ import annotations

import re

NO_DETAILS = (0, 0)
# the details' key: a caller holding a whole answer tests for it first (``in``, no call), as
# most engines report no details
DETAILS_KEY = b'"prompt_tokens_details"'
_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
_IMAGE = re.compile(rb'"image"\s*:\s*(\d+)')


def prompt_details(data: bytes, start: int = 0, stop: int | None = None) -> tuple[int, int]:
    """(cached tokens, image tokens) of the last ``prompt_tokens_details`` in data[start:stop]."""
    end = len(data) if stop is None else stop
    at = data.rfind(DETAILS_KEY, start, end)
    if at < 0:
        return NO_DETAILS
    cached, image = _CACHED.search(data, at, end), _IMAGE.search(data, at, end)
    return (int(cached[1]) if cached else 0, int(image[1]) if image else 0)
