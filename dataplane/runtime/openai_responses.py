"""The answers of vLLM's OpenAI-compatible API as the simulated engine sends them. Pure: no I/O.

Each body has the keys, in the order, that vLLM 0.32 sends (its pydantic models dumped whole,
or in streams with ``exclude_unset``), checked against the installed source and against its
answers to the same requests:

- completions: openai/completion/serving.py ``request_output_to_completion_response`` and
  ``completion_stream_generator``; choice ``index`` = prompt index x n + choice, prompt-major;
  the integer ``logprobs`` form ``{text_offset, token_logprobs, tokens, top_logprobs}``;
- chat: openai/chat_completion/serving.py ``chat_completion_full_generator`` and
  ``chat_completion_stream_generator``; a stream opens with a ``{role, content: ""}`` chunk per
  choice; ``logprobs: {content: [{token, logprob, bytes, top_logprobs}]}``;
- a stream's chunks carry one choice each; the last chunk of a choice has its ``finish_reason``
  and ``stop_reason``; with ``stream_options.include_usage`` a final chunk with empty
  ``choices`` carries the usage (and ``continuous_usage_stats`` puts usage in every chunk);
- ``/v1/models``: serve/engine/protocol.py ``ModelCard``; ``/tokenize``, ``/detokenize``:
  serve/tokenize/protocol.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from dataplane.runtime import sim_generation, sim_tokenizer
from dataplane.runtime.openai_request import ParsedRequest, Prompt
from dataplane.runtime.sim_generation import Candidate, SequenceOutput

# Fields of vLLM's answers that the sim has nothing for; sent as null, as vLLM sends them.
_COMPLETION_EXTRAS = {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
_MESSAGE_EXTRAS = {
    "refusal": None,
    "annotations": None,
    "audio": None,
    "function_call": None,
    "reasoning": None,
}

LogprobEntry = tuple[int, list[Candidate] | None]  # a token and its candidates (None: no logprob)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """UsageInfo's keys in its field order, as a stream chunk sends them."""
    total = prompt_tokens + completion_tokens
    return {"prompt_tokens": prompt_tokens, "total_tokens": total, "completion_tokens": completion_tokens}


def _full_usage(
    prompt_tokens: int, completion_tokens: int, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        **usage(prompt_tokens, completion_tokens),
        "prompt_tokens_details": details,
        "completion_tokens_details": None,
    }


def prompt_tokens_details(
    cached_tokens: int, image_tokens: int, created_cache_tokens: int | None = None
) -> dict[str, Any]:
    """usage.prompt_tokens_details as vLLM sends it with --enable-prompt-tokens-details
    (PromptTokenUsageInfo): the prompt tokens the prefix cache held, those it wrote (chat only;
    null in completions), and the images' tokens (already in prompt_tokens) under
    multimodal_tokens, null without images."""
    return {
        "cached_tokens": cached_tokens,
        "created_cache_tokens": created_cache_tokens,
        "multimodal_tokens": {"image": image_tokens} if image_tokens else None,
    }


def _prompt_of(req: ParsedRequest, choice: int) -> Prompt:
    return req.prompts[choice // req.n]


def _output_entries(out: SequenceOutput, positions: range, req: ParsedRequest) -> list[LogprobEntry]:
    # The engine returns each token and its top-k; logprobs=0 means the token alone.
    return [(out.token_ids[i], out.top(i, req.logprobs or 0)) for i in positions]


def _prompt_entries(prompt: Prompt, count: int) -> list[LogprobEntry]:
    return list(zip(prompt.token_ids, sim_generation.prompt_logprobs(prompt.token_ids, count), strict=True))


def completion_logprobs(entries: Sequence[LogprobEntry], text_offset: int) -> dict[str, Any]:
    """CompletionLogProbs (serving.py _create_completion_logprobs): offsets advance by each token's text."""
    out: dict[str, list[Any]] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for token_id, candidates in entries:
        token = sim_tokenizer.token_text(token_id)
        out["text_offset"].append(text_offset)
        out["tokens"].append(token)
        if candidates is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
        else:
            out["token_logprobs"].append(candidates[0].logprob)
            out["top_logprobs"].append({sim_tokenizer.token_text(c.token_id): c.logprob for c in candidates})
        text_offset += len(token)
    return out


def _chat_logprob(token_id: int, logprob: float) -> dict[str, Any]:
    token = sim_tokenizer.token_text(token_id)
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", errors="replace"))}


def chat_logprobs(out: SequenceOutput, positions: range, top_logprobs: int) -> dict[str, Any]:
    """ChatCompletionLogProbs (serving.py _create_chat_logprobs): the token first in its top."""
    content = []
    for position in positions:
        candidates = out.top(position, top_logprobs)
        entry = _chat_logprob(out.token_ids[position], candidates[0].logprob)
        entry["top_logprobs"] = [_chat_logprob(c.token_id, c.logprob) for c in candidates[:top_logprobs]]
        content.append(entry)
    return {"content": content}


def prompt_logprobs_body(prompt: Prompt, count: int) -> list[dict[str, dict[str, Any]] | None]:
    """The ``prompt_logprobs`` field: per prompt token {id: {logprob, rank, decoded_token}}."""
    return [
        None
        if candidates is None
        else {
            str(c.token_id): {
                "logprob": c.logprob,
                "rank": c.rank,
                "decoded_token": sim_tokenizer.token_text(c.token_id),
            }
            for c in candidates
        }
        for candidates in sim_generation.prompt_logprobs(prompt.token_ids, count)
    ]


def _with_echo(
    req: ParsedRequest, prompt: Prompt, text: str, entries: Callable[[], list[LogprobEntry]]
) -> tuple[str, Callable[[], list[LogprobEntry]]]:
    """Completions with echo: the prompt's text and logprobs before the output's (only them when
    max_tokens is 0); with return_token_ids the prompt's ids stand in for its text (serving.py)."""
    prompt_text = "" if req.return_token_ids else prompt.text

    def with_prompt() -> list[LogprobEntry]:
        prompt_entries = _prompt_entries(prompt, req.prompt_logprobs or 0)
        return prompt_entries if req.echo_only else prompt_entries + entries()

    return (prompt_text if req.echo_only else prompt_text + text), with_prompt


def _completion_choice(req: ParsedRequest, index: int, out: SequenceOutput) -> dict[str, Any]:
    prompt = _prompt_of(req, index)
    text = out.text
    entries: Callable[[], list[LogprobEntry]] = partial(_output_entries, out, range(len(out.token_ids)), req)
    if req.echo:
        text, entries = _with_echo(req, prompt, text, entries)
    with_prompt_logprobs = req.prompt_logprobs is not None
    return {
        "index": index,
        "text": text,
        "logprobs": completion_logprobs(entries(), 0) if req.logprobs is not None else None,
        "finish_reason": out.finish_reason,
        "stop_reason": out.stop_reason,
        "token_ids": list(out.token_ids) if req.return_token_ids else None,
        "prompt_logprobs": prompt_logprobs_body(prompt, req.prompt_logprobs or 0)
        if with_prompt_logprobs
        else None,
        "prompt_token_ids": list(prompt.token_ids) if req.return_token_ids else None,
        "routed_experts": None,
    }


def _chat_choice(req: ParsedRequest, index: int, out: SequenceOutput) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": req.answer_role, "content": req.echo_text + out.text, **_MESSAGE_EXTRAS},
        "logprobs": chat_logprobs(out, range(len(out.token_ids)), req.logprobs)
        if req.logprobs is not None
        else None,
        "finish_reason": out.finish_reason,
        "stop_reason": out.stop_reason,
        "token_ids": list(out.token_ids) if req.return_token_ids else None,
        "routed_experts": None,
    }


def full_response(
    req: ParsedRequest,
    outputs: Sequence[SequenceOutput],
    request_id: str,
    created: int,
    fingerprint: str,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The non-streamed answer: every choice, usage summed over them (prompts counted once)."""
    completion_tokens = sum(len(out.token_ids) for out in outputs)
    obj = "chat.completion" if req.chat else "text_completion"
    head = {"id": request_id, "object": obj, "created": created, "model": req.model}
    tail = {
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": _full_usage(req.prompt_tokens, completion_tokens, details),
    }
    if not req.chat:
        choices = [_completion_choice(req, i, out) for i, out in enumerate(outputs)]
        return {**head, "choices": choices, **tail, **_COMPLETION_EXTRAS}
    prompt = req.prompts[0]
    chat_extras = {
        "prompt_logprobs": None
        if req.prompt_logprobs is None
        else prompt_logprobs_body(prompt, req.prompt_logprobs),
        "prompt_token_ids": list(prompt.token_ids) if req.return_token_ids else None,
        "prompt_text": None,
    }
    choices = [_chat_choice(req, i, out) for i, out in enumerate(outputs)]
    return {**head, "choices": choices, **tail, **chat_extras, **_COMPLETION_EXTRAS}


class StreamWriter:
    """The chunks of one streamed request, as vLLM sends them, fed one generated token at a time."""

    def __init__(
        self,
        req: ParsedRequest,
        outputs: Sequence[SequenceOutput],
        request_id: str,
        created: int,
        fingerprint: str,
        details: dict[str, Any] | None = None,
    ):
        self.req = req
        self.details = details  # usage.prompt_tokens_details of the usage chunk; None: not sent
        self.outputs = outputs
        self.fingerprint = fingerprint
        obj = "chat.completion.chunk" if req.chat else "text_completion"
        self._head: dict[str, Any] = {"id": request_id, "object": obj, "created": created, "model": req.model}
        self._sent_tokens = [0] * len(outputs)  # tokens streamed per choice
        self._prompt_sent = [False] * len(outputs)  # completions: echo / prompt ids sent per choice
        self._text_offset = [0] * len(outputs)  # completions logprobs: text offset per choice
        self._opened = False  # chat: the role chunks are sent

    def token(self, choice: int, position: int) -> list[dict[str, Any]]:
        """The chunks to send when ``choice`` generated its token at ``position``."""
        self._sent_tokens[choice] += 1
        if self.req.chat:
            return [*self._chat_opening(), self._chat_chunk(choice, position)]
        return [self._completion_chunk(choice, position)]

    def usage_chunk(self) -> dict[str, Any] | None:
        """The final chunk with empty choices and the whole usage, when include_usage asks for it."""
        if not self.req.include_usage:
            return None
        return {
            **self._head,
            "choices": [],
            "usage": usage(self.req.prompt_tokens, sum(self._sent_tokens))
            | ({"prompt_tokens_details": self._sent_details()} if self.details is not None else {}),
            "system_fingerprint": self.fingerprint,
        }

    def _sent_details(self) -> dict[str, Any]:
        """A stream's usage details as vLLM dumps its chunks (exclude_unset, and for chat
        exclude_none too): only the counts it has, no nulls (a full answer keeps them)."""
        assert self.details is not None
        return {key: value for key, value in self.details.items() if value is not None}

    def _chunk(self, body: dict[str, Any], last: bool) -> dict[str, Any]:
        """A chunk of one choice; with continuous usage stats, that choice's usage so far."""
        chunk = {**self._head, "choices": [body]}
        if self.req.continuous_usage:
            choice = body["index"]
            chunk["usage"] = usage(len(_prompt_of(self.req, choice).token_ids), self._sent_tokens[choice])
            if self.req.chat:
                chunk["usage"]["completion_tokens_details"] = None
        if last and not self.req.include_usage:  # else the usage chunk carries it
            chunk["system_fingerprint"] = self.fingerprint
        return chunk

    def _completion_chunk(self, choice: int, position: int) -> dict[str, Any]:
        req, out = self.req, self.outputs[choice]
        last = position == len(out.token_ids) - 1
        prompt = _prompt_of(req, choice)
        text = out.deltas[position]
        entries: Callable[[], list[LogprobEntry]] = partial(
            _output_entries, out, range(position, position + 1), req
        )
        prompt_ids = None
        if not self._prompt_sent[choice] and (req.echo or req.return_token_ids):
            self._prompt_sent[choice] = True
            prompt_ids = list(prompt.token_ids)
            if req.echo:  # the first chunk of each choice carries the prompt
                text, entries = _with_echo(req, prompt, text, entries)
        logprobs = None
        if req.logprobs is not None:
            logprobs = completion_logprobs(entries(), self._text_offset[choice])
            self._text_offset[choice] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        body = {
            "index": choice,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": out.finish_reason if last else None,
            "stop_reason": out.stop_reason if last else None,
            "prompt_token_ids": prompt_ids,
            "token_ids": [out.token_ids[position]] if req.return_token_ids else None,
        }
        return self._chunk(body, last)

    def _chat_opening(self) -> list[dict[str, Any]]:
        """Before the first token: a role chunk per choice, then the echoed text per choice."""
        if self._opened:
            return []
        self._opened = True
        req, chunks = self.req, []
        prompt_tokens = req.prompt_tokens
        opening_usage = {**usage(prompt_tokens, 0), "completion_tokens_details": None}
        for choice in range(req.n):
            chunk = {
                **self._head,
                "choices": [
                    {
                        "index": choice,
                        "delta": {"role": req.answer_role, "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            if req.continuous_usage:
                chunk["usage"] = opening_usage
            chunk["prompt_token_ids"] = list(req.prompts[0].token_ids) if req.return_token_ids else None
            chunk["prompt_text"] = None
            chunks.append(chunk)
        for choice in range(req.n if req.echo_text else 0):
            chunk = {
                **self._head,
                "choices": [
                    {
                        "index": choice,
                        "delta": {"content": req.echo_text},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            if req.continuous_usage:
                chunk["usage"] = opening_usage
            chunks.append(chunk)
        return chunks

    def _chat_chunk(self, choice: int, position: int) -> dict[str, Any]:
        req, out = self.req, self.outputs[choice]
        last = position == len(out.token_ids) - 1
        body: dict[str, Any] = {
            "index": choice,
            "delta": {"content": out.deltas[position]},
            "logprobs": chat_logprobs(out, range(position, position + 1), req.logprobs)
            if req.logprobs is not None
            else None,
            "finish_reason": out.finish_reason if last else None,
        }
        if last:
            body["stop_reason"] = out.stop_reason
        body["token_ids"] = [out.token_ids[position]] if req.return_token_ids else None
        return self._chunk(body, last)


def models_body(
    model: str,
    max_model_len: int,
    created: int,
    permission_id: str,
    profile: str,
    time_scale: float,
) -> dict[str, Any]:
    """GET /v1/models: vLLM's ModelCard (the served name as ``root``: no weights are behind it)."""
    permission = {
        "id": f"modelperm-{permission_id}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
        # Not part of vLLM's card: says plainly that no model is behind this endpoint, and how
        # much faster than real time it runs (a benchmark measures in the engine's time).
        "simulated": True,
        "sim_profile": profile,
        "time_scale": time_scale,
    }
    return {"object": "list", "data": [card]}


def tokenize_body(token_ids: Sequence[int], max_model_len: int, with_strs: bool) -> dict[str, Any]:
    strs = [sim_tokenizer.token_text(t) for t in token_ids] if with_strs else None
    return {
        "count": len(token_ids),
        "max_model_len": max_model_len,
        "tokens": list(token_ids),
        "token_strs": strs,
    }


def detokenize_body(token_ids: Sequence[int]) -> dict[str, str]:
    return {"prompt": sim_tokenizer.decode(token_ids)}
