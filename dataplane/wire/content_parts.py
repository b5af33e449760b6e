"""A chat message's content parts as vLLM 0.32 reads them (renderers/chat_utils.py): the type a
part is read as, with or without its ``type`` field, and which types hold text. Pure; the
router (validation, image and text pricing) and the simulated engine classify parts with these
rules.
"""

from __future__ import annotations

from typing import Any

# The part types vLLM's MM_PARSER_MAP knows: read by their type when the part has no uuid.
VLLM_PART_TYPES = frozenset(
    {"text", "thinking", "input_text", "output_text", "input_image", "image_url", "image_embeds",
     "audio_embeds", "video_embeds", "prompt_embeds", "image_pil", "audio_url", "input_audio",
     "refusal", "video_url", "tool_reference"}
)  # fmt: skip
# Of those, the ones its chat request validation takes: input_text and output_text are the
# Responses API's text parts, which a chat message's content refuses.
CHAT_PART_TYPES = VLLM_PART_TYPES - {"input_text", "output_text"}
# The fields vLLM reads a part by when it has no type (or a uuid), in vLLM's order of precedence.
TYPELESS_FIELDS = (
    "image_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds", "audio_url",
    "input_audio", "video_url", "tool_reference",
)  # fmt: skip
# The fields of vLLM's bare-URL parts (CustomChatCompletionContentSimple{Image,Audio,Video}Param,
# a string or null): the only parts without a type (or with a null one) its validation accepts.
BARE_URL_FIELDS = ("image_url", "audio_url", "video_url")
# Types vLLM reads as text (TEXT_PART_TYPES); refusal and thinking parts keep their text in a
# field named after the type, the others in "text".
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})
OWN_FIELD_PARTS = ("refusal", "thinking")
# Types that carry no media (vLLM's _TEXT_CONTENT_PART_TYPES): the text ones and a tool reference,
# whose name the chat template expands (joined into the prompt where it takes strings).
NON_MEDIA_PART_TYPES = TEXT_PART_TYPES | {"tool_reference"}
IMAGE_PART_TYPES = frozenset({"image_url", "input_image"})  # the parts whose URL is an image


def part_kind(part: dict[str, Any]) -> str | None:
    """The type vLLM reads a content part as (``_parse_chat_message_content_mm_part``); None
    where vLLM refuses the part itself: a type that is not a string, or no type (missing or null)
    and no bare URL (``{"image_url": {"url": ...}}``, ``{"text": "hi"}`` and ``{}`` fail its
    validation; ``{"image_url": "<url>"}`` is an image). An unknown string type is returned as is
    (vLLM refuses it as unsupported)."""
    kind = part.get("type")
    uuid = part.get("uuid")
    if uuid is None and isinstance(kind, str) and kind in VLLM_PART_TYPES:
        return kind
    if kind is None and uuid is None and not any(_is_bare_url(part, field) for field in BARE_URL_FIELDS):
        return None
    if kind is None or uuid is not None:
        # validated, vLLM reads the part by its first media field, whichever made it valid
        return next((field for field in TYPELESS_FIELDS if field in part), None)
    return kind if isinstance(kind, str) else None


def _is_bare_url(part: dict[str, Any], field: str) -> bool:
    return field in part and (part[field] is None or isinstance(part[field], str))


def text_field(kind: str | None) -> str:
    """The field a part of this type (of NON_MEDIA_PART_TYPES) keeps the text vLLM reads in."""
    return "name" if kind == "tool_reference" else kind if kind in OWN_FIELD_PARTS else "text"


def part_text(part: dict[str, Any]) -> str | None:
    """The text vLLM reads from a content part (renderers/chat_utils.py
    _parse_chat_message_content_part): a text part's text field, or a tool reference's name,
    which it joins into the prompt as text where the chat template takes strings; None for
    media and refused parts, and where the field is not a string."""
    kind = part_kind(part)
    value = part.get(text_field(kind)) if kind in NON_MEDIA_PART_TYPES else None
    return value if isinstance(value, str) else None
