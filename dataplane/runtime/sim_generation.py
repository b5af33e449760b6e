"""What the simulated model generates: its words, stop strings and logprobs. Pure: no I/O, no clock.

The model draws each output token from ``SIM_WORDS``, 32 word pieces of at most 4 bytes, so each
is one token of ``sim_tokenizer`` and detokenizing the output ids gives the output text. The draw
comes from a random generator seeded, as vLLM's sampler is seeded (sampling_params.py,
v1/engine/parallel_sampling.py), by:

- greedy decoding (temperature 0): the prompt alone, so a prompt always gets the same text;
- ``seed`` s: the prompt and s + the choice's index (vLLM gives the n choices of a request the
  seeds s, s+1, ...), so the same seed gives the same text and the n choices differ;
- no seed: a fresh draw from the engine's own generator, so each request differs.

Every drawn token is the most likely one: its probability p is drawn in [0.35, 0.95) and the
k-th alternative (the next words in ``SIM_WORDS``) gets (1 - p) / 2**k, so the logprobs form a
distribution whose mass is at most 1. A prompt token (echo, ``prompt_logprobs``) gets p in
[0.02, 0.5) and the same tail, and its rank is where p falls among them.

Stop strings are matched as vLLM's detokenizer does (v1/engine/detokenizer.py,
``check_stop_strings``): after each token, a stop string that completes in the new text ends
the sequence with ``finish_reason "stop"`` and ``stop_reason`` the string, and the text is cut
before it (or after it with ``include_stop_str_in_output``); the token that completed it is
counted. While stop strings are cut from the text, a stream holds back the last (longest stop - 1)
characters until the sequence finishes, so a stop string is never streamed in part.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from dataplane.runtime import sim_tokenizer

SIM_WORDS = (
    " sim", "ulat", "ed", " tok", "en", " tex", "t", ".", " The", " eng", "ine", " say", "s", " no",
    " mod", "el", " run", " her", "e", ",", " and", " a", " GPU", " is", " not", " in", " use",
    " it", " jus", " wai", " to", "\n",
)  # fmt: skip
WORD_IDS = tuple(sim_tokenizer.run_id(word.encode()) for word in SIM_WORDS)
GREEDY_TEMPERATURE = 1e-5  # below this temperature sampling is greedy (vLLM's _SAMPLING_EPS)


@dataclass(frozen=True)
class Candidate:
    token_id: int
    logprob: float  # natural log of its probability, <= 0
    rank: int  # 1 = most likely


@dataclass(frozen=True)
class SequenceOutput:
    """One choice: the tokens it generated, one entry per token in each tuple, and how it ended."""

    token_ids: tuple[int, ...]
    words: tuple[int, ...]  # each token's index into SIM_WORDS
    probabilities: tuple[float, ...]  # each token's, 0.35..0.95; it is always the most likely
    deltas: tuple[str, ...]  # the text a stream sends with each token (held back for stop strings)
    text: str  # the output text, cut at a stop string
    finish_reason: str  # "stop" (a stop string) or "length" (max_tokens)
    stop_reason: str | None  # the stop string that ended it

    def top(self, position: int, count: int) -> list[Candidate]:
        """The token at ``position`` and the count - 1 next most likely (just it when count <= 1)."""
        word, probability = self.words[position], self.probabilities[position]
        first = Candidate(self.token_ids[position], math.log(probability), 1)
        return [first] + [_alternative(word, probability, k, k + 1) for k in range(1, count)]


def _alternative(word: int, probability: float, k: int, rank: int) -> Candidate:
    """The k-th alternative to a token of probability p: the k-th word after SIM_WORDS[word],
    with probability (1 - p) / 2**k (>= 0.05 / 2**20, so a logprob is never below -17)."""
    return Candidate(WORD_IDS[(word + k) % len(WORD_IDS)], math.log((1.0 - probability) / 2**k), rank)


def _rng(*parts: object) -> random.Random:
    # A string seed is hashed with SHA-512 by random itself: the same in every process.
    return random.Random(repr(parts))


def sequence_rng(
    prompt_ids: Sequence[int], seed: int | None, choice: int, greedy: bool, engine_rng: random.Random
) -> random.Random:
    """The generator one choice draws its tokens from (see the module docstring)."""
    if greedy:
        return _rng("greedy", tuple(prompt_ids))
    if seed is not None:
        return _rng("seed", seed + choice, tuple(prompt_ids))
    return random.Random(engine_rng.getrandbits(64))


def _find_stop(text: str, new_chars: int, stop: Sequence[str]) -> tuple[str, int] | None:
    """(stop string, its index) of the stop string completing earliest in the last ``new_chars``
    characters of ``text``, ties by list order; vLLM's check_stop_strings."""
    best: tuple[str, int] | None = None
    best_end = sys.maxsize
    for stop_str in stop:
        index = text.find(stop_str, max(0, len(text) + 1 - new_chars - len(stop_str)))
        if index != -1 and index + len(stop_str) < best_end:
            best, best_end = (stop_str, index), index + len(stop_str)
    return best


def generate(
    rng: random.Random,
    max_tokens: int,
    stop: Sequence[str] = (),
    include_stop_str_in_output: bool = False,
    min_tokens: int = 0,
) -> SequenceOutput:
    """Draw up to ``max_tokens`` tokens, ending early at a stop string (after ``min_tokens``)."""
    # vLLM's stop_buffer_length: held back from a stream while stop strings are cut from the text.
    hold_back = 0 if include_stop_str_in_output else max((len(s) for s in stop), default=1) - 1
    text, sent = "", 0  # the text so far; how much of it a stream has been sent
    words: list[int] = []
    probabilities: list[float] = []
    deltas: list[str] = []
    finish_reason, stop_reason = "length", None
    for _ in range(max_tokens):
        draw = rng.random() * len(SIM_WORDS)  # one draw: the word, and from its fraction p
        word = int(draw)
        words.append(word)
        probabilities.append(0.35 + 0.6 * (draw - word))
        piece = SIM_WORDS[word]
        text += piece
        found = _find_stop(text, len(piece), stop) if stop and len(words) > min_tokens else None
        if found is not None:
            stop_reason, index = found
            finish_reason = "stop"
            text = text[: index + len(stop_reason)] if include_stop_str_in_output else text[:index]
            deltas.append(text[sent:])
            break
        upto = len(text) if len(words) == max_tokens else max(sent, len(text) - hold_back)
        deltas.append(text[sent:upto])
        sent = upto
    token_ids = tuple(WORD_IDS[w] for w in words)
    return SequenceOutput(
        token_ids, tuple(words), tuple(probabilities), tuple(deltas), text, finish_reason, stop_reason
    )


def prompt_logprobs(prompt_ids: Sequence[int], count: int) -> list[list[Candidate] | None]:
    """vLLM's prompt logprobs: None for the first token (nothing precedes it), then each prompt
    token with its logprob and rank, followed by the ``count`` most likely tokens at its place
    that are not it (vLLM's dict: the actual token first, then the top ``count``)."""
    out: list[list[Candidate] | None] = [None]
    for position, token_id in enumerate(prompt_ids[1:], start=1):
        rng = _rng("prompt", position, token_id)
        probability, word = 0.02 + 0.48 * rng.random(), rng.randrange(len(SIM_WORDS))
        # The alternatives more likely than the prompt token, (1 - p) / 2**k > p, rank before it:
        # p = 0.1 -> k < log2(9) = 3.17 -> 3 of them, and the prompt token is rank 4.
        above = max(0, math.ceil(math.log2((1 - probability) / probability)) - 1)
        actual = Candidate(token_id, math.log(probability), above + 1)
        ranked = [_alternative(word, probability, k, k) for k in range(1, above + 1)]
        ranked += [actual] + [_alternative(word, probability, k, k + 1) for k in range(above + 1, count)]
        out.append([actual, *(c for c in ranked[:count] if c.token_id != token_id)])
    return out
