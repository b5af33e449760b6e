"""The simulated engine's tokenizer: deterministic, invertible, no vocabulary file. Pure: no I/O.

A token is a run of 1 to 4 bytes of the UTF-8 text, taken left to right, so a text of B bytes
is ceil(B / 4) tokens ("Hello world!" -> 3; the usual ~4 bytes per English BPE token, the
rule the router's estimate uses too). Each byte run has its own id, so every text encodes and
decodes back exactly, and every id below ``VOCAB_SIZE`` = 2**32 decodes: ids 0..255 are single
bytes, then come the 2-, 3- and 4-byte runs, and the last ids are the special tokens of the chat
template, in place of 4-byte runs that start with 0xFE, a byte UTF-8 never uses. (Ids fit in 32
bits, as every tokenizer's do: vLLM's own refuses larger ones.) A single token may end inside a
multi-byte character, as byte-level BPE tokens do; it then shows as U+FFFD on its own and
decodes exactly in sequence.

The chat template wraps each message in four tokens: ``<|im_start|>``, the role, a newline and
``<|im_end|>`` around its content ("hi there" as a user message -> 4 + 2 = 6 tokens). Known roles
are one special token each; any other role (vLLM accepts custom roles) is spelled out in bytes.
There is no BOS token and no generation prompt, so ``add_special_tokens`` and
``add_generation_prompt`` change nothing here.

/tokenize, /detokenize and ``usage.prompt_tokens`` all count with this module, so they agree.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_BYTES_PER_TOKEN = 4  # UTF-8 bytes in one byte-run token (a special token's text is longer)
# First id of the byte runs of each length: 1 -> 0, 2 -> 256, 3 -> 65,792, 4 -> 16,843,008.
_RUN_BASE = {1: 0, 2: 256, 3: 256 + 256**2, 4: 256 + 256**2 + 256**3}
VOCAB_SIZE = 2**32
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
ROLES = ("system", "user", "assistant", "tool", "developer", "function")
SPECIAL_TOKENS = (IM_START, IM_END, *(f"<|{role}|>" for role in ROLES))
FIRST_SPECIAL = VOCAB_SIZE - len(SPECIAL_TOKENS)  # the run b"\xfe\xfe\xfe\xf8": never in UTF-8
SPECIAL_IDS = {text: FIRST_SPECIAL + i for i, text in enumerate(SPECIAL_TOKENS)}
# The longest token text, 13 ("<|assistant|>"): vLLM bounds a prompt's characters by it.
# Characters (len of a str), not bytes: 4 bytes hold at most 4 characters; special tokens are ASCII.
MAX_CHARS_PER_TOKEN = max(MAX_BYTES_PER_TOKEN, *map(len, SPECIAL_TOKENS))
NEWLINE_ID = ord("\n")


def run_id(run: bytes) -> int:
    """The id of one byte run (1..4 bytes): b"H" -> 72, b"He" -> 256 + 0x4865 = 18,789."""
    return _RUN_BASE[len(run)] + int.from_bytes(run, "big")


def token_bytes(token_id: int) -> bytes:
    """The bytes a token stands for; a special token's are its text. Raises for ids out of vocabulary."""
    if not 0 <= token_id < VOCAB_SIZE:
        raise ValueError(f"Token id {token_id} is out of vocabulary")
    if token_id >= FIRST_SPECIAL:
        return SPECIAL_TOKENS[token_id - FIRST_SPECIAL].encode()
    length = max(n for n, base in _RUN_BASE.items() if token_id >= base)
    return (token_id - _RUN_BASE[length]).to_bytes(length, "big")


def encode(text: str) -> list[int]:
    data = text.encode()
    return [run_id(data[i : i + MAX_BYTES_PER_TOKEN]) for i in range(0, len(data), MAX_BYTES_PER_TOKEN)]


def decode(token_ids: Sequence[int]) -> str:
    return b"".join(token_bytes(t) for t in token_ids).decode(errors="replace")


def token_text(token_id: int) -> str:
    """One token's text on its own (what logprobs and ``return_token_strs`` show)."""
    return decode([token_id])


def role_ids(role: str) -> list[int]:
    special = SPECIAL_IDS.get(f"<|{role}|>")
    return [special] if special is not None else encode(role)


def render_chat(messages: Sequence[tuple[str, str]]) -> list[int]:
    """Token ids of a conversation of (role, text) messages, by the template above."""
    ids: list[int] = []
    for role, text in messages:
        ids += [SPECIAL_IDS[IM_START], *role_ids(role), NEWLINE_ID, *encode(text), SPECIAL_IDS[IM_END]]
    return ids
