"""The simulated engine's prefix cache: which prompt tokens a request finds computed already, as
vLLM's automatic prefix caching decides it. Pure: no I/O, no clock.

vLLM hashes a prompt in blocks of ``block_size`` tokens (16), each block's hash chained to the
one before, so a block hits only when every token before it matches too; a hit is whole blocks,
and at most prompt - 1 tokens (the last prompt token is always computed to sample the first
output token: v1/core/kv_cache_manager.py, max_cache_hit_length = num_tokens - 1). It reports the
hits in ``usage.prompt_tokens_details.cached_tokens`` (with --enable-prompt-tokens-details) and
counts them in ``vllm:prefix_cache_queries`` (prompt tokens looked up) and
``vllm:prefix_cache_hits`` (of those, found). Blocks are evicted least recently used first.

A request's ``cache_salt`` keys its prompt's first block (``block_hashes``): prompts with
different salts share no cached block, prompts with the same salt (or none) share as ever.

Worked numbers (block 16): a 100-token prompt whose first 70 tokens an earlier prompt had ->
4 blocks (64 tokens) cached; the same 100-token prompt again -> 96 (6 blocks; the 7th is partial).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence

BLOCK_SIZE = 16  # vLLM's default --block-size on GPUs


class PrefixCache:
    """Block hashes of prompts seen, LRU, at most ``capacity_blocks`` of them."""

    def __init__(self, capacity_blocks: int, block_size: int = BLOCK_SIZE) -> None:
        if capacity_blocks < 0 or block_size < 1:
            raise ValueError(
                f"need capacity_blocks >= 0 and block_size >= 1, got {capacity_blocks}, {block_size}"
            )
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0  # prompt tokens looked up (vllm:prefix_cache_queries)
        self.hits = 0  # prompt tokens found (vllm:prefix_cache_hits)

    def lookup(self, token_ids: Sequence[int], salt: str | None = None) -> int:
        """Cached tokens of this prompt (of a request with ``cache_salt`` ``salt``); its full
        blocks are then cached (most recent)."""
        return self.lookup_blocks(block_hashes(token_ids, self.block_size, salt=salt), len(token_ids))

    def lookup_blocks(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """``lookup`` of a prompt of ``prompt_tokens`` whose full blocks hash to ``hashes``
        (``block_hashes``: a caller that knows a prefix's hashes extends them)."""
        blocks = self._blocks
        hit, hitting = 0, True
        for h in hashes:
            if hitting and h in blocks:
                hit += 1
                blocks.move_to_end(h)
            else:
                hitting = False
                blocks[h] = None
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
        b = self.block_size
        cached = min(hit * b, max(prompt_tokens - 1, 0) // b * b)
        self.queries += prompt_tokens
        self.hits += cached
        return cached


def block_hashes(
    token_ids: Sequence[int], block_size: int = BLOCK_SIZE, parent: int = 0, salt: str | None = None
) -> list[int]:
    """The chained hashes of the full blocks of ``token_ids`` (``parent``: the hash of the block
    before the first, 0 at a prompt's start). A request's ``cache_salt`` (``salt``; None and ""
    are none) is an extra key of its prompt's first block only, as vLLM's
    (v1/core/kv_cache_utils.py generate_block_hash_extra_keys: start_token_idx == 0 and a salt);
    the chain carries it to every later block, so prompts of different salts share no block."""
    full = len(token_ids) - len(token_ids) % block_size
    data = array("Q", token_ids[:full]).tobytes()  # one C pass; each block hashes as a byte slice
    step = block_size * 8  # 8 bytes an id
    hashes = []
    for start in range(0, len(data), step):
        if start == 0 and parent == 0 and salt:
            parent = hash((parent, data[:step], ("cache_salt", salt)))
        else:
            parent = hash((parent, data[start : start + step]))
        hashes.append(parent)
    return hashes
