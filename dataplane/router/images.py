"""Images in a chat request, counted without decoding them: how many, their sizes and the
prompt tokens they will take (capacity.units.image_tokens, by resolution), so the router can
price them (``delta`` MU per image token) and refuse what it will not pass on. Pure; no I/O.

Parts are classified as vLLM 0.32 classifies them (``dataplane.wire.content_parts.part_kind``):
by ``type`` when it is a type vLLM knows and the part carries no ``uuid``, else by the first
media field present (a part with no ``type`` but an ``image_url`` is an image). Images are
priced; every other media part (video, audio, embeddings, PIL images) is refused with a 400
naming the part: the router cannot price its encoder work, and a video or audio URL is fetched
by the pod.

The rule for image URLs: a base64 data URL of a PNG, JPEG, WebP or GIF is counted (its width
and height from the header bytes, read as vLLM reads the URL: dataplane.wire.images); a remote
URL (http, https, file, ...) is refused with a 400 naming the part. The router does not fetch:
a fetch on the hot path is unbounded latency and a request-forgery vector, and an image whose
size is unknown until it is fetched cannot be priced on admission. Clients send data URLs (as
the OpenAI SDK does for local files). A malformed data URL is a 400 naming the part too, never
a 500.

Worked numbers: two 448 x 448 PNG parts in one message -> ImageCount(images=2, image_tokens=512,
image_bytes=<their decoded sizes>).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from capacity.units import image_tokens
from dataplane.router.http import RequestError
from dataplane.wire.content_parts import IMAGE_PART_TYPES, part_kind
from dataplane.wire.images import ImageError, is_data_url, read_data_url

MAX_IMAGES = 64  # per request: above any vision model's context budget for images
# Header blocks all of a request's images may walk before their frames together, beyond each
# one's own bound (wire.images.header_blocks): 64 images of 128, or one XMP-laden GIF of 8,192;
# at 0.2-0.4 us a block, about 1 us where each block needs a window of its own (segments or
# junk runs longer than one), a request's sizing stays under ~8 ms whatever its size (a review
# measured 7.3-8.2 ms for 8,000 such blocks).
MAX_REQUEST_BLOCKS = 8192
# Media the router cannot price (no size it can read without decoding or fetching): refused.
UNPRICED_MEDIA_TYPES = frozenset(
    {"image_pil", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds", "audio_url", "input_audio",
     "video_url"}
)  # fmt: skip


class ImageCount(NamedTuple):
    images: int  # image parts in the request, >= 0
    image_tokens: int  # the prompt tokens they take, by resolution, >= 0
    image_bytes: int  # their decoded sizes, summed, from the base64 lengths, >= 0


NO_IMAGES = ImageCount(0, 0, 0)


def refused(param: str, message: str) -> RequestError:
    return RequestError(400, f"{param}: {message}", "invalid_image", param=param)


def count_images(messages: Any) -> ImageCount:
    """Count the image parts of chat messages; a 400 naming the part for a remote or malformed URL
    and for a media part the router cannot price.

    Messages that are not a list and text parts count nothing here (the router's message
    validation owns their shape)."""
    if not isinstance(messages, list):
        return NO_IMAGES
    images = tokens = size = 0
    blocks_left = MAX_REQUEST_BLOCKS
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part_kind(part) if isinstance(part, dict) else None
            if kind in UNPRICED_MEDIA_TYPES:
                raise refused(
                    f"messages[{i}].content[{j}]",
                    f"{kind} parts are not accepted: the router prices images only"
                    " (data:image/...;base64 URLs)",
                )
            if kind not in IMAGE_PART_TYPES:
                continue
            # vLLM reads an input_image's URL from its own "image_url" string, an image_url's
            # from image_url.url (a bare string too when the part has no type or a uuid).
            field = part.get("image_url")
            nested = kind == "image_url" and not isinstance(field, str)
            where = f"messages[{i}].content[{j}].image_url" + (".url" if nested else "")
            url = (field.get("url") if isinstance(field, dict) else None) if nested else field
            if not isinstance(url, str):
                raise refused(where, "must be a string (a data:image/...;base64 URL)")
            if not is_data_url(url):
                scheme = url.split(":", 1)[0][:16] if ":" in url else "no scheme"
                raise refused(
                    where,
                    f"only data:image/...;base64 URLs are accepted, not {scheme!r}"
                    " (the router does not fetch images)",
                )
            try:
                image = read_data_url(url, blocks_left)
            except ImageError as error:
                raise refused(where, str(error)) from None
            images += 1
            blocks_left -= image.blocks
            if images > MAX_IMAGES:
                raise refused("messages", f"more than {MAX_IMAGES} images in one request")
            tokens += image_tokens(image.width, image.height)
            size += image.size_bytes
    return ImageCount(images, tokens, size)
