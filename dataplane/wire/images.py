"""Image data URLs (``data:image/png;base64,...``) as the OpenAI chat format carries them: the
media type, the decoded size from the base64 length, and the width and height from the image's
header bytes, without decoding the image. Pure; the router (pricing, refusals) and the simulated
engine (its vision encoder's work) read images with this one reader.

A data URL is read as vLLM 0.32's media connector reads it (the format sniffed from the bytes,
whatever the media type says), and the walk to the frame is bounded by ``header_blocks(size)``
(32 blocks plus one per 32 bytes): a file past it is refused though Pillow would open it. Worked
numbers: a 4,000-character payload holds 3,000 bytes; a 448 x 448 PNG is read from its first 32
characters. Formats, bounds and why: docs/router.md, "Image data URLs".
"""

from __future__ import annotations

import binascii
import struct
from dataclasses import dataclass

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # per image: OpenAI's limit for an image input
MAX_SIDE_PX = 16384  # per side: larger is a decompression bomb, not a photo
HEADER_BLOCKS_BASE = 32  # blocks any image may walk before its frame: EXIF, ICC, DQT take a few
HEADER_BYTES_PER_BLOCK = 32  # and one more per this many bytes: XMP walks one per 33 or more
WINDOW_BYTES = 48  # decoded at once by a walker: 64 characters, a dozen small blocks
# "data:image/jpeg;base64," is 23; parameters (a file name) make it longer: this bounds the
# search for its comma, not a payload's
HEADER_MAX_CHARS = 1024
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # frame headers (not DHT, JPG, DAC)
_GIF_HEAD = 14  # an extension's head: introducer, label, length, 11 bytes of a NETSCAPE2.0 block
_BLOCKS_DONE, _IN_BLOCKS, _ONE_BLOCK = 0, 1, 2  # where a GIF walk is: between blocks, in sub-blocks
# Markers with no length, stepped over as Pillow steps over them: TEM, RSTn, and SOI / EOI (an
# EOI + SOI pair before the frame ends a tables-only stream, and libjpeg decodes the frame after
# it: read as a length, FF D9 jumped 65,498 bytes onto a fake 16 x 16 frame, pricing a
# 2000 x 2000 image at 4 tokens); 0x00, an escaped 0xFF.
_NO_LENGTH = frozenset({0x00, 0x01, *range(0xD0, 0xDA)})
_MARKER = struct.Struct(">BBH")  # 0xFF, the marker, the segment's length (where it has one)


class ImageError(ValueError):
    """What is wrong with an image data URL, in words (the caller names the part)."""


@dataclass(frozen=True)
class DataImage:
    media_type: str  # as the URL says it, without parameters ("" if none); the bytes decide the format
    size_bytes: int  # decoded size, from the base64 length
    width: int  # pixels, >= 1
    height: int  # pixels, >= 1
    blocks: int  # blocks walked before its frame (GIF, JPEG; 0 for PNG, WebP), <= header_blocks


def header_blocks(size_bytes: int) -> int:
    """The most blocks a reader walks before an image's frame: 32 + 1 per 32 bytes (a 1,536-byte
    GIF: 80; a 3 MiB JPEG: 98,336), so the walk costs a bounded multiple of the image's bytes."""
    return HEADER_BLOCKS_BASE + size_bytes // HEADER_BYTES_PER_BLOCK


class _Base64Bytes:
    """Random access to the bytes of a base64 payload (``url[start:]``, not copied), decoding
    only what is read."""

    def __init__(self, url: str, start: int) -> None:
        self.url, self.start = url, start
        self.size = (len(url) - start) // 4 * 3 - (2 if url.endswith("==") else 1 if url.endswith("=") else 0)

    def read(self, start: int, length: int) -> bytes:
        if start < 0 or start + length > self.size:
            raise ImageError("the image ends before its header does")
        first, last = start // 3 * 4, -(-(start + length) // 3) * 4
        try:
            chunk = binascii.a2b_base64(self.url[self.start + first : self.start + last], strict_mode=True)
        except ValueError:  # binascii.Error, and a non-ASCII character (which would be a 500)
            raise ImageError("the data is not valid base64") from None
        offset = start - first // 4 * 3
        return chunk[offset : offset + length]

    def window(self, start: int) -> bytes:
        """The bytes from ``start`` on, WINDOW_BYTES of them (fewer at the end, never none)."""
        return self.read(start, max(1, min(WINDOW_BYTES, self.size - start)))


def is_data_url(url: str) -> bool:
    """Whether ``url`` is a data URL (its scheme in any case, as URL schemes are)."""
    return url[:5].lower() == "data:"


def read_data_url(url: str, blocks_left: int | None = None) -> DataImage:
    """The image a ``data:<media type>;base64,<data>`` URL holds; ImageError says what is wrong.
    ``blocks_left``: what is left of a budget shared by several images (a request's), if any."""
    if not is_data_url(url):
        raise ImageError("not a data URL")
    # up to the comma, "" without one near the start; not url.partition, which copies the payload
    header = url[: url.find(",", 0, HEADER_MAX_CHARS) + 1]
    spec, sep, encoding = header[len("data:") : -1].rpartition(";")
    if not header or not sep or encoding != "base64":  # "data:base64,..." too, as vLLM refuses it
        raise ImageError("a data URL must be data:[<media type>][;<param>=<value>]*;base64,<data>")
    media_type = spec.partition(";")[0]
    chars = len(url) - len(header)
    if not chars or chars % 4:
        raise ImageError("the base64 data's length must be a positive multiple of 4")
    data = _Base64Bytes(url, len(header))
    if data.size > MAX_IMAGE_BYTES:
        raise ImageError(f"an image may hold at most {MAX_IMAGE_BYTES} bytes, this one holds {data.size}")
    width, height, blocks = image_size(data, blocks_left)
    if not (1 <= width <= MAX_SIDE_PX and 1 <= height <= MAX_SIDE_PX):
        raise ImageError(f"an image must be 1 to {MAX_SIDE_PX} pixels a side, this one is {width} x {height}")
    return DataImage(media_type, data.size, width, height, blocks)


def image_size(data: _Base64Bytes, blocks_left: int | None = None) -> tuple[int, int, int]:
    """(width, height, blocks walked) from the header of a PNG, GIF, WebP or JPEG, whatever the
    media type claims (engines sniff the bytes too)."""
    head = data.read(0, min(data.size, 12))
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        ihdr = data.read(12, 12)
        if ihdr[:4] != b"IHDR":
            raise ImageError("a PNG must start with its IHDR chunk")
        return int.from_bytes(ihdr[4:8], "big"), int.from_bytes(ihdr[8:12], "big"), 0
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return _gif_size(data, _limit(data, blocks_left))
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        head = data.read(0, 30)
        kind = head[12:16]
        if kind == b"VP8 ":
            return (
                int.from_bytes(head[26:28], "little") & 0x3FFF,
                int.from_bytes(head[28:30], "little") & 0x3FFF,
                0,
            )
        if kind == b"VP8L":
            b = head[21:25]
            return 1 + (b[0] | (b[1] & 0x3F) << 8), 1 + (b[1] >> 6 | b[2] << 2 | (b[3] & 0x0F) << 10), 0
        if kind == b"VP8X":
            return 1 + int.from_bytes(head[24:27], "little"), 1 + int.from_bytes(head[27:30], "little"), 0
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(data, _limit(data, blocks_left))
    raise ImageError("the data is not a PNG, JPEG, WebP or GIF image")


def _gif_size(data: _Base64Bytes, limit: int) -> tuple[int, int, int]:
    """Walked as Pillow's GifImageFile._seek(0) reads (PIL 13): a byte it does not know between
    blocks is skipped; an extension's first sub-block is read with its head, and when there is
    none (the terminator right after the label) the sub-blocks are read on past it, but for a
    comment's; a NETSCAPE2.0 application block's next sub-block is read whatever its length."""
    width, height, flags = struct.unpack("<HHB", data.read(6, 5))
    at = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # after the global color table
    base, window = at, b""  # window: the decoded bytes from base on
    state = _BLOCKS_DONE
    for walked in range(1, limit + 1):  # one budget for blocks and sub-blocks together
        if at + _GIF_HEAD > base + len(window) and base + len(window) < data.size:
            base, window = at, data.window(at)
        i = at - base
        if i >= len(window):
            raise ImageError("the image ends before its header does")
        byte = window[i]
        if state == _IN_BLOCKS:  # a sub-block's length: an empty one ends the extension
            at, state = at + 1 + byte, _IN_BLOCKS if byte else _BLOCKS_DONE
        elif state == _ONE_BLOCK:
            at, state = at + 1 + byte, _IN_BLOCKS
        elif byte == 0x21:  # an extension: introducer, label, its first sub-block, the rest
            if i + 3 > len(window):
                raise ImageError("the image ends before its header does")
            label, first = window[i + 1], window[i + 2]
            at += 3 + first
            if not first:
                state = _BLOCKS_DONE if label == 0xFE else _IN_BLOCKS
            elif label == 0xFF and window[i + 3 : i + 14] == b"NETSCAPE2.0":
                state = _ONE_BLOCK
            else:
                state = _IN_BLOCKS
        elif byte == 0x2C:  # image descriptor: left, top, width, height (little-endian)
            left, top, w, h = struct.unpack("<4H", data.read(at + 1, 8))
            return max(width, left + w), max(height, top + h), walked
        elif byte == 0x3B:
            raise ImageError("a GIF has no image before its end")
        else:
            at += 1
    raise ImageError(_too_many_blocks("GIF", data.size, limit))


def _jpeg_size(data: _Base64Bytes, limit: int) -> tuple[int, int, int]:
    at = 2
    base, window = at, b""  # window: the decoded bytes from base on
    for walked in range(1, limit + 1):
        if at + 4 > base + len(window):  # a marker and its length
            base, window = at, data.window(at)
        if at + 4 > base + len(window):  # fewer bytes left than a frame header's first 4
            raise ImageError("the image ends before its header does")
        ff, marker, length = _MARKER.unpack_from(window, at - base)  # one call: a fast step
        if ff != 0xFF:  # junk between segments: Pillow skips to the next 0xFF, and so do we (a block)
            found = window.find(b"\xff", at - base)
            at = base + (found if found >= 0 else len(window))
        elif marker == 0xFF:  # fill byte
            at += 1
        elif marker in _NO_LENGTH:
            at += 2
        elif length < 2:
            raise ImageError("a JPEG segment's length is under 2")
        elif marker in _SOF:
            height, width = struct.unpack(">HH", data.read(at + 5, 4))
            return width, height, walked
        else:
            at += 2 + length
    raise ImageError(_too_many_blocks("JPEG", data.size, limit))


def _limit(data: _Base64Bytes, blocks_left: int | None) -> int:
    own = header_blocks(data.size)
    return own if blocks_left is None else min(own, blocks_left)


def _too_many_blocks(kind: str, size: int, limit: int) -> str:
    if limit < header_blocks(size):  # the shared budget ran out first
        return (
            f"a {kind} of {size} bytes has more blocks before its frame than the {limit} its"
            " request's images had left of what they may walk together"
        )
    return (
        f"a {kind} of {size} bytes may have at most {limit} blocks before its frame"
        f" ({HEADER_BLOCKS_BASE} + 1 per {HEADER_BYTES_PER_BLOCK} bytes), this one has more"
    )
