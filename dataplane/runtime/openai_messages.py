"""A chat request's conversation as vLLM reads it. Pure: no I/O.

``messages`` (a role, string or content-part content, and the fields a chat template renders
beside it), each message's text as vLLM joins its parts, a vision model's images (data URLs
only: the simulated engine does not fetch), and the conversation as token ids by the sim's chat
template (``sim_tokenizer.render_chat``). A media part sent to a text-only model is vLLM's 400.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

from dataplane.runtime import sim_tokenizer
from dataplane.runtime.openai_request import ApiError, Body, ServedModel, _error
from dataplane.wire.content_parts import CHAT_PART_TYPES, NON_MEDIA_PART_TYPES, part_kind, text_field
from dataplane.wire.images import ImageError, is_data_url, read_data_url
from engine_model.vision import VisionProfile

# Content-part types vLLM hands to a multimodal processor, which a text-only model does not have
# (those it parses as text: dataplane.wire.content_parts).
MEDIA_PART_TYPES = frozenset(
    {"image_url", "input_image", "image_pil", "image_embeds", "audio_url", "input_audio", "audio_embeds",
     "video_url", "video_embeds"}
)  # fmt: skip


@dataclass(frozen=True)
class _Message:
    role: str
    content: str | list[Any]  # a string or content parts
    # what a chat template renders beside the content: the name, tool calls (as JSON), the id
    # of the call a tool message answers; "" when the message has none
    extra: str = ""


TEMPLATE_FIELDS = ("name", "tool_calls", "tool_call_id")  # a message's, rendered after its content


def _extra(msg: dict[str, Any]) -> str:
    values = (msg.get(k) for k in TEMPLATE_FIELDS)
    return "".join(f"\n{v if isinstance(v, str) else json.dumps(v)}" for v in values if v is not None)


def _messages(body: Body) -> list[_Message]:
    """``messages``: each a dict with a string role and string or content-part content."""
    if "messages" not in body.raw:
        body.fail(_error("missing", ("messages",), "Field required", body.raw))
        return []
    out: list[_Message] = []
    for i, msg in enumerate(body.list_value(body.raw["messages"], ("messages",)) or []):
        if not isinstance(msg, dict):
            body.fail(_error("dict_type", ("messages", i), "Input should be a valid dictionary", msg))
        elif "role" not in msg:
            body.fail(_error("missing", ("messages", i, "role"), "Field required", msg))
        elif (role := body.str_value(msg["role"], ("messages", i, "role"))) is None:
            pass
        elif not isinstance(content := msg.get("content", ""), (str, list)):
            body.fail(
                _error("string_type", ("messages", i, "content"), "Input should be a valid string", content)
            )
        else:
            out.append(_Message(role, content, _extra(msg)))
    return out


def _render(raw: dict[str, Any], messages: list[_Message], texts: list[str]) -> list[int]:
    """The conversation's token ids by the sim's template, with everything a model's chat
    template renders: the request's ``tools`` as JSON in a system turn first (where ChatML
    templates put them), then each message's text and its ``extra``. A conversation with an
    8,000-byte tool definition is 2,000 tokens longer, as it is to vLLM."""
    tools = raw.get("tools")
    turns = [("system", json.dumps(tools))] if isinstance(tools, list) and tools else []
    turns += [(m.role, text + m.extra) for m, text in zip(messages, texts, strict=True)]
    return sim_tokenizer.render_chat(turns)


def _part_error(index: int, field: str, problem: str, kind: str, value: object) -> ApiError:
    """vLLM validates content parts as it renders them, and pydantic's ValidationError, a
    ValueError, is a 400 without param; vLLM lists each union branch, the sim the first fault."""
    found = f"[type={kind}, input_value={value!r}, input_type={type(value).__name__}]"
    return ApiError(400, f"1 validation error for ValidatorIterator\n{index}.{field}\n  {problem} {found}")


def _message_text(message: _Message, served: ServedModel, images: list[str] | None = None) -> str:
    """A message's text: its text parts (and plain strings) joined by newlines, as vLLM joins
    them (renderers/chat_utils.py _parse_chat_message_content_parts); a vision model's image
    URLs are appended to ``images``."""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for j, part in enumerate(message.content):
        if isinstance(part, str):
            texts.append(part)
            continue
        # As vLLM reads it: no type but a URL string is its bare-image part (CustomChatCompletion-
        # ContentSimpleImageParam), read as an image; a typeless dict is refused.
        kind = part_kind(part) if isinstance(part, dict) else None
        if kind == "image_url" and served.vision is not None and images is not None:
            field = part.get("image_url")
            url = field.get("url") if isinstance(field, dict) else field
            if not isinstance(url, str):
                raise _part_error(j, "image_url.url", "Field required", "missing", part)
            images.append(url)
            continue
        if kind in MEDIA_PART_TYPES:
            # chat_utils.py -> multimodal/registry.py create_processor raises a ValueError: 400.
            raise ApiError(400, f"{served.name} is not a multimodal model")
        if not isinstance(part, dict) or kind not in NON_MEDIA_PART_TYPES or kind not in CHAT_PART_TYPES:
            expected = "Input should be 'text', 'image_url', 'input_audio' or 'file'"
            given = part.get("type") if isinstance(part, dict) else None
            raise _part_error(j, "type", expected, "literal_error", given)
        field = text_field(kind)
        if field not in part:
            raise _part_error(j, field, "Field required", "missing", part)
        if not isinstance(part[field], str):
            raise _part_error(j, field, "Input should be a valid string", "string_type", part[field])
        texts.append(part[field])
    return "\n".join(texts)


def _image_size(url: str) -> tuple[int, int]:
    """(width, height) of an image data URL; a 400 as vLLM's media connector gives for a bad one.
    The simulated engine does not fetch: a remote URL is a 400 too (vLLM would fetch it)."""
    if not is_data_url(url):
        raise ApiError(400, "the simulated engine does not fetch remote images; send a data URL")
    try:
        image = read_data_url(url)
    except ImageError as error:
        raise ApiError(400, f"Failed to load image: {error}") from None
    return image.width, image.height


def _image_ids(urls: list[str], sizes: tuple[tuple[int, int], ...], vision: VisionProfile) -> list[int]:
    """The images' placeholder tokens, after the text (vLLM puts them where the part was): 4-byte
    runs of hex digits from the image's CRC, so the same image is the same tokens (its prefix
    cache blocks hit, as vLLM's multimodal hashes make them) and another image is not."""
    ids: list[int] = []
    for url, (w, h) in zip(urls, sizes, strict=True):
        crc = zlib.crc32(url.encode())
        runs = (f"{(crc + k) & 0xFFFF:04x}".encode() for k in range(vision.image_tokens(w, h)))
        ids += (sim_tokenizer.run_id(run) for run in runs)
    return ids
