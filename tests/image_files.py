"""Image files for tests, built byte by byte (no imaging library): a whole PNG (zlib, CRCs), and
the headers of GIF, WebP (VP8, VP8L, VP8X) and JPEG files, which is all a size reader reads."""

from __future__ import annotations

import base64
import struct
import zlib


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int) -> bytes:
    """A decodable greyscale PNG of width x height (all black)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    raw = b"".join(b"\x00" + b"\x00" * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", zlib.compress(raw))
        + _chunk(b"IEND", b"")
    )


def gif(
    width: int, height: int, frame: tuple[int, int, int, int] | None = None, empty_extensions: int = 0
) -> bytes:
    """A GIF with a width x height logical screen, a 2-color global table, ``empty_extensions``
    empty comment extensions (3 bytes each, a file made to be slow to read), a graphic control
    extension and a comment, then one image descriptor (``frame``: left, top, width, height; the
    whole screen by default) and its (dummy) image data."""
    left, top, w, h = frame or (0, 0, width, height)
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    extensions = b"\x21\xfe\x00" * empty_extensions
    extensions += b"\x21\xf9\x04\x00\x00\x00\x00\x00" + b"\x21\xfe\x05hello\x03abc\x00"
    image = b"\x2c" + struct.pack("<HHHHB", left, top, w, h, 0) + b"\x02\x02\x44\x01\x00"
    return screen + extensions + image + b";"


def webp_vp8x(width: int, height: int) -> bytes:
    body = b"WEBPVP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
    body += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", len(body)) + body


def webp_vp8l(width: int, height: int) -> bytes:
    bits = (width - 1) | (height - 1) << 14
    body = b"WEBPVP8L" + struct.pack("<I", 5) + b"\x2f" + struct.pack("<I", bits) + b"\x00" * 8
    return b"RIFF" + struct.pack("<I", len(body)) + body


def webp_vp8(width: int, height: int) -> bytes:
    frame = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height)
    body = b"WEBPVP8 " + struct.pack("<I", len(frame) + 4) + frame + b"\x00" * 4
    return b"RIFF" + struct.pack("<I", len(body)) + body


def jpeg(width: int, height: int, exif_bytes: int = 0, empty_segments: int = 0, junk: bytes = b"") -> bytes:
    """SOI, an APP0, ``junk`` (bytes between segments, which Pillow skips), an APP1 (EXIF)
    segment of ``exif_bytes``, ``empty_segments`` empty COM segments (4 bytes each), the SOF0
    frame header, EOI."""
    out = (
        b"\xff\xd8"
        + b"\xff\xe0"
        + struct.pack(">H", 16)
        + b"JFIF\x00"
        + b"\x01\x01\x00\x00\x01\x00\x01\x00\x00"
        + junk
    )
    if exif_bytes:
        out += b"\xff\xe1" + struct.pack(">H", exif_bytes + 2) + b"\x00" * exif_bytes
    out += b"\xff\xfe\x00\x02" * empty_segments
    out += b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return out + b"\xff\xd9"


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def image_part(data: bytes, media_type: str = "image/png") -> dict[str, object]:
    """A chat content part carrying the image, as the OpenAI SDK sends one."""
    return {"type": "image_url", "image_url": {"url": data_url(data, media_type)}}
