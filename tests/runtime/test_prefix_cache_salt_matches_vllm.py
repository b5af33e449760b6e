"""The simulated prefix cache's block hashes share blocks exactly where vLLM 0.32's do, salted or
not: vLLM's own block hasher (v1/core/kv_cache_utils.py get_request_block_hasher, sha256) on
requests with and without ``cache_salt``, against ``prefix_cache.block_hashes``. No engine runs:
the hasher is a pure function of the request's tokens and salt.

Run with ``scripts/test-vllm.sh`` (skipped where vllm is not installed)."""

from __future__ import annotations

import importlib.util
import itertools
import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from dataplane.runtime.prefix_cache import BLOCK_SIZE, block_hashes

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed here"),
]

SHARED = list(range(1, 41))  # 2.5 blocks every prompt starts with
PROMPTS = [SHARED + list(range(100, 140)), SHARED + list(range(200, 240)), SHARED[:16] + [7] * 64]
SALTS = [None, "tenant-a", "tenant-b"]


def vllm_hashes(tokens: list[int], salt: str | None) -> list[Any]:
    with warnings.catch_warnings():  # torch's own deprecation warnings as vLLM imports it
        warnings.simplefilter("ignore")
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    request = SimpleNamespace(  # the fields the hasher reads (a text request, no LoRA)
        block_hashes=[],
        num_tokens=len(tokens),
        all_token_ids=tokens,
        mm_features=[],
        lora_request=None,
        cache_salt=salt,
        prompt_embeds=None,
    )
    return list(get_request_block_hasher(BLOCK_SIZE, sha256)(request))


def test_blocks_are_shared_where_vllm_shares_them():
    cases = [(p, s) for p in PROMPTS for s in SALTS]
    theirs = {i: vllm_hashes(p, s) for i, (p, s) in enumerate(cases)}
    ours = {i: block_hashes(p, BLOCK_SIZE, salt=s) for i, (p, s) in enumerate(cases)}
    shared_somewhere = False
    for a, b in itertools.combinations(range(len(cases)), 2):
        for block in range(min(len(theirs[a]), len(theirs[b]))):
            same = theirs[a][block] == theirs[b][block]
            assert (ours[a][block] == ours[b][block]) == same, (cases[a][1], cases[b][1], block)
            shared_somewhere |= same
            if same:  # vLLM shares only within one salt
                assert cases[a][1] == cases[b][1]
    assert shared_somewhere  # the shared prefix's blocks, within a salt
