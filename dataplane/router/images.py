"""Images in a chat request, counted without decoding them: how many, and how many bytes each
data URL holds (from its base64 length), so the router can price them (capacity.units' `delta`
MU per image) and refuse what it will not pass on. Pure; no I/O.

The rule for image URLs: a `data:image/<png|jpeg|webp|gif>;base64,...` URL is counted; any other
URL (http, https, file, ...) is refused with a 400 naming the part. The router does not fetch: a
fetch on the hot path is unbounded latency, a request forgery vector, and an image whose size is
unknown until fetched cannot be priced on admission. Clients send data URLs (as the OpenAI SDK
does for local files).

Worked numbers: a 4,000-character base64 payload holds 3,000 bytes (2,999 with one "=" of
padding); two such parts in one message -> ImageCount(images=2, image_bytes=6,000).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
MAX_IMAGE_BYTES = 20 * 1024 * 1024  # per image: OpenAI's limit for an image input
MAX_IMAGES = 64  # per request: above any vision model's context budget for images


class ImageError(ValueError):
    """A part the router refuses: 400, naming the parameter."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


@dataclass(frozen=True)
class ImageCount:
    images: int  # image parts in the request, >= 0
    image_bytes: int  # their decoded sizes, summed, from the base64 lengths; >= 0


NO_IMAGES = ImageCount(0, 0)


def count_images(messages: Any) -> ImageCount:
    """Count the `image_url` parts of chat messages; refuse a remote or malformed URL.

    Messages that are not a list, and parts that are not image parts, count nothing here (the
    router's message validation owns their shape)."""
    if not isinstance(messages, list):
        return NO_IMAGES
    images = total = 0
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "image_url"):
                continue
            where = f"messages[{i}].content[{j}].image_url"
            size = data_url_bytes(_url(part.get("image_url"), where), f"{where}.url")
            images += 1
            total += size
            if images > MAX_IMAGES:
                raise ImageError("messages", f"more than {MAX_IMAGES} images in one request")
    return ImageCount(images, total)


def _url(image_url: Any, where: str) -> str:
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str):
        raise ImageError(f"{where}.url", "image_url.url must be a string")
    return url


def data_url_bytes(url: str, param: str, media_types: Sequence[str] = MEDIA_TYPES) -> int:
    """Decoded bytes of a base64 image data URL, from its length alone: 4 characters are 3
    bytes, less one per "=" of padding."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0][:16] if ":" in url else "no scheme"
        raise ImageError(
            param,
            f"only data:image/...;base64 URLs are accepted, not {scheme!r} (the router does not fetch)",
        )
    header, comma, payload = url.partition(",")
    media_type, _, encoding = header[len("data:") :].partition(";")
    if not comma or encoding != "base64" or media_type not in media_types:
        raise ImageError(param, f"a data URL must be data:<{'|'.join(media_types)}>;base64,<data>")
    if not payload or len(payload) % 4:
        raise ImageError(param, "the base64 data's length must be a positive multiple of 4")
    size = len(payload) // 4 * 3 - (2 if payload.endswith("==") else 1 if payload.endswith("=") else 0)
    if size > MAX_IMAGE_BYTES:
        raise ImageError(param, f"an image may hold at most {MAX_IMAGE_BYTES} bytes, this one holds {size}")
    return size
