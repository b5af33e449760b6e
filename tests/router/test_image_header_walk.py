"""The walk to an image's frame is bounded by the image's size (dataplane.wire.images
``header_blocks``: 32 blocks + 1 per 32 bytes): a GIF of thousands of empty extensions or a
JPEG of thousands of empty segments, files made to be slow to read, is a 400 naming the part
once it walks past its bound, having decoded only the walk; a file within the bound, and any
honest metadata (a 300 KB comment, an XMP packet as Adobe writes it, random layouts of
extensions and segments across the readers' decoding windows), is sized as Pillow (vLLM's
decoder) opens it."""

from __future__ import annotations

import base64
import json
import random
import struct
import subprocess

import pytest

from dataplane.router.http import RequestError
from dataplane.router.images import MAX_REQUEST_BLOCKS, count_images
from dataplane.wire.images import ImageError, header_blocks, read_data_url
from tests.image_files import data_url, gif, image_part, jpeg
from tests.installed_vllm import vllm_python

GIF_BLOCKS = 6  # gif()'s walk without empty extensions: 2 (graphic control) + 3 (comment) + 1 (frame)
JPEG_BLOCKS = 2  # jpeg()'s without empty segments: APP0 and the frame header


def test_the_bound_grows_with_the_image():
    assert header_blocks(0) == 32
    assert header_blocks(1536) == 32 + 48
    assert header_blocks(3 << 20) == 32 + 98_304


def _largest_priced(blocks_for, build) -> int:
    """The most empty blocks whose walk fits the image's bound (blocks_for(k): the walk's length)."""
    return max(k for k in range(200) if blocks_for(k) <= header_blocks(len(build(k))))


def test_empty_gif_extensions_are_priced_up_to_the_bound_and_refused_past_it():
    def build(k: int) -> bytes:
        return gif(64, 64, empty_extensions=k)

    k = _largest_priced(lambda k: GIF_BLOCKS + k, build)  # a block an empty extension
    assert k == 30  # 36 blocks in 146 bytes (32 + 4 allowed)
    image = read_data_url(data_url(build(k), "image/gif"))
    assert (image.width, image.height) == (64, 64)
    with pytest.raises(ImageError, match=r"a GIF of 149 bytes may have at most 36 blocks before its frame"):
        read_data_url(data_url(build(k + 1), "image/gif"))


def test_empty_jpeg_segments_are_priced_up_to_the_bound_and_refused_past_it():
    def build(k: int) -> bytes:
        return jpeg(320, 240, empty_segments=k)

    k = _largest_priced(lambda k: JPEG_BLOCKS + k, build)
    assert k == 35  # 37 blocks in 181 bytes (32 + 5 allowed)
    image = read_data_url(data_url(build(k), "image/jpeg"))
    assert (image.width, image.height) == (320, 240)
    with pytest.raises(ImageError, match=r"a JPEG of \d+ bytes may have at most \d+ blocks"):
        read_data_url(data_url(build(k + 40), "image/jpeg"))


def test_a_request_of_slow_gifs_is_a_400_naming_the_first_after_a_bounded_walk(decoded):
    """The reviewer's request: 64 GIFs of 510 empty extensions each (138 KB), which the old
    per-image cap (1,024 blocks) walked to the end, 65,000 blocks in all."""
    slow = image_part(gif(1, 1, empty_extensions=510), "image/gif")
    with pytest.raises(RequestError) as caught:
        count_images([{"role": "user", "content": ["look", slow]}, {"role": "user", "content": [slow] * 63}])
    assert caught.value.status == 400 and caught.value.param == "messages[0].content[1].image_url.url"
    assert "a GIF of 1586 bytes may have at most 81 blocks before its frame (32 + 1 per 32 bytes)" in (
        caught.value.message
    )
    # the first image only, and of its 2,116 characters the 500 its 81 blocks walk (3 bytes each)
    assert sum(decoded) < 600


def test_the_images_of_a_request_share_one_budget():
    """Each within its own bound, 201 blocks of 6,235 bytes' 226; 64 of them walk 12,864 blocks,
    past the request's 8,192: the 41st is refused, what the first 40 left (152) short of it."""
    slow = _gif_with(b"\x21\xfe\x00" * 200, frame=(0, 0, 64, 64)) + bytes(5600)  # trailing bytes: unread
    assert len(slow) == 6235 and read_data_url(data_url(slow, "image/gif")).blocks == 201
    assert MAX_REQUEST_BLOCKS == 8192
    parts = [image_part(slow, "image/gif")] * 64
    with pytest.raises(RequestError) as caught:
        count_images([{"role": "user", "content": parts}])
    assert caught.value.param == "messages[0].content[40].image_url.url"
    assert "than the 152 its request's images had left" in caught.value.message
    assert count_images([{"role": "user", "content": parts[:40]}]).images == 40


def test_a_large_comment_is_walked_past_the_old_cap():
    """300 KB of comment in 255-byte sub-blocks: 1,180 blocks walked, past the old cap of 1,024."""
    comment = b"\x21\xfe" + (b"\xff" + b"c" * 255) * 1176 + b"\x10" + b"c" * 16 + b"\x00"
    data = _gif_with(comment, frame=(0, 0, 800, 600))
    assert _sizes([data], "image/gif") == [(800, 600)]


def test_an_xmp_packet_as_adobe_writes_it_is_walked():
    """Adobe's XMP in a GIF: raw text read as sub-blocks (each byte taken as a length), padded
    with 2 KB of spaces (33-byte steps), then the 258-byte "magic trailer" (1, 255, 254, ..., 1,
    0, 0) that brings any walk to the terminator: about 1 block per 33 to 80 bytes."""
    packet = b'<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
    packet += b"\n <rdf:RDF><rdf:Description xmp:CreatorTool='Adobe Photoshop'/></rdf:RDF>\n</x:xmpmeta>"
    packet += (b" " * 99 + b"\n") * 20 + b'<?xpacket end="w"?>'
    trailer = b"\x01" + bytes(range(255, -1, -1)) + b"\x00"
    xmp = b"\x21\xff\x0bXMP DataXMP" + packet + trailer
    data = _gif_with(xmp, frame=(0, 0, 16, 16))
    assert len(data) < 2500 and _sizes([data], "image/gif") == [(16, 16)]


def test_a_gif_is_walked_as_pillow_reads_its_empty_extensions():
    """Pillow takes an empty extension's terminator for its first sub-block (none) and reads on
    for more past it (a comment excepted): the 0x2C after an empty application extension is a
    sub-block's length to it, 44 bytes skipped, and the frame it opens at is the one after."""
    decoy = b"\x2c" + struct.pack("<HHHHB", 0, 0, 8, 8, 0) + b"\x00" * 35  # a length byte and 44
    data = _gif_with(b"\x21\xff\x00" + decoy + b"\x00", frame=(0, 0, 1600, 1200))
    assert _sizes([data], "image/gif") == [(1600, 1200)]  # not the 8 x 8 decoy (4 tokens)
    comment = _gif_with(b"\x21\xfe\x00", frame=(0, 0, 1600, 1200))  # a comment ends where it says
    netscape = b"\x21\xff\x0bNETSCAPE2.0\x00" + decoy + b"\x00"  # its loop sub-block read, empty too
    assert _sizes([comment, _gif_with(netscape, frame=(0, 0, 900, 700))], "image/gif") == [
        (1600, 1200),
        (900, 700),
    ]


def _gif_with(extensions: bytes, frame: tuple[int, int, int, int]) -> bytes:
    screen = b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    image = b"\x2c" + struct.pack("<HHHHB", *frame, 0) + b"\x02\x02\x44\x01\x00"
    return screen + extensions + image + b";"


def _random_gif(rng: random.Random) -> tuple[bytes, tuple[int, int]]:
    """A GIF of random extensions (sub-blocks of 1 to 255 bytes, straddling the readers' windows)
    and a random first frame, and the size Pillow opens it at (the screen grown to the frame)."""
    width, height = rng.randint(1, 300), rng.randint(1, 300)
    bits = rng.randint(0, 7)
    out = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80 | bits, 0, 0) + rng.randbytes(3 << (bits + 1))
    for _ in range(rng.randint(0, 6)):
        if rng.random() < 0.1:  # a byte that is no block: Pillow skips it
            out += bytes([rng.choice([b for b in range(256) if b not in (0x21, 0x2C, 0x3B)])])
        label = rng.choice((0x01, 0xF9, 0xFE, 0xFF))
        # an empty extension reads on past its terminator in Pillow (_a_gif_is_walked_as_pillow...)
        least = 0 if label == 0xFE else 1
        blocks = [4] if label == 0xF9 else [rng.randint(1, 255) for _ in range(rng.randint(least, 5))]
        out += bytes([0x21, label]) + b"".join(bytes([n]) + rng.randbytes(n) for n in blocks) + b"\x00"
    left, top, w, h = rng.randint(0, 200), rng.randint(0, 200), rng.randint(1, 400), rng.randint(1, 400)
    out += b"\x2c" + struct.pack("<HHHHB", left, top, w, h, 0) + b"\x02\x02\x44\x01\x00;"
    return out, (max(width, left + w), max(height, top + h))


def _random_jpeg(rng: random.Random) -> tuple[bytes, tuple[int, int]]:
    """A JPEG of random APPn and COM segments (2 to 300 bytes), fill bytes and restart markers
    before its frame header, then a scan."""
    out = b"\xff\xd8"
    for _ in range(rng.randint(0, 12)):
        kind = rng.random()
        if kind < 0.15:
            out += b"\xff" * rng.randint(1, 5)  # fill bytes, before the next marker
        elif kind < 0.25:
            out += bytes([0xFF, rng.randint(0xD0, 0xD7)])  # a restart marker: no length
        else:
            n = rng.randint(0, 300)
            out += bytes([0xFF, rng.choice((0xE0, 0xE1, 0xE2, 0xED, 0xFE))]) + struct.pack(">H", n + 2)
            out += rng.randbytes(n)
    width, height = rng.randint(1, 5000), rng.randint(1, 5000)
    out += b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    out += b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00" + rng.randbytes(64) + b"\xff\xd9"
    return out, (width, height)


def _sizes(files: list[bytes], media_type: str) -> list[tuple[int, int]]:
    """Each file's size as the router reads it; the same list from Pillow where .venv-vllm is."""
    ours = [(image.width, image.height) for image in (read_data_url(data_url(f, media_type)) for f in files)]
    if python := vllm_python("Pillow's reading"):
        code = (
            "import base64,io,json,sys;from PIL import Image;files=json.load(sys.stdin);"
            "print(json.dumps([Image.open(io.BytesIO(base64.b64decode(f))).size for f in files]))"
        )
        sent = json.dumps([base64.b64encode(f).decode() for f in files]).encode()
        out = subprocess.run([python, "-c", code], input=sent, capture_output=True, check=True).stdout
        assert [tuple(size) for size in json.loads(out)] == ours
    return ours


@pytest.mark.parametrize(("media_type", "make"), [("image/gif", _random_gif), ("image/jpeg", _random_jpeg)])
def test_random_layouts_are_sized_as_built_and_as_pillow_opens_them(media_type, make):
    rng = random.Random(20261202)
    files, expected = zip(*(make(rng) for _ in range(200)), strict=True)
    assert _sizes(list(files), media_type) == list(expected)
