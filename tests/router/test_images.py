"""Images in a chat request counted from their header bytes: sizes per format, the prompt tokens
they take (capacity.units.image_tokens), the refusals (a remote URL, a malformed data URL: a 400
naming the part, never a 500) and the decoding kept to the header."""

import base64
import json
import subprocess

import pytest

from capacity.units import image_tokens
from dataplane.router.http import RequestError
from dataplane.router.images import NO_IMAGES, ImageCount, count_images
from dataplane.wire.content_parts import CHAT_PART_TYPES, VLLM_PART_TYPES, part_kind, part_text
from dataplane.wire.images import ImageError, read_data_url
from tests.image_files import data_url, gif, image_part, jpeg, png, webp_vp8, webp_vp8l, webp_vp8x
from tests.installed_vllm import vllm_python_or_skip


@pytest.mark.parametrize(
    ("data", "media_type", "size"),
    [
        (png(448, 448), "image/png", (448, 448)),
        (png(3, 7), "image/png", (3, 7)),
        (gif(640, 480), "image/gif", (640, 480)),
        (gif(1, 1, frame=(0, 0, 1000, 800)), "image/gif", (1000, 800)),  # a frame over the screen
        (gif(10, 10, frame=(5, 6, 10, 10)), "image/gif", (15, 16)),  # the screen grown to hold it
        (gif(640, 480, frame=(5, 5, 10, 10)), "image/gif", (640, 480)),
        (webp_vp8x(1024, 768), "image/webp", (1024, 768)),
        (webp_vp8l(300, 5000), "image/webp", (300, 5000)),
        (webp_vp8(320, 240), "image/webp", (320, 240)),
        (jpeg(1920, 1080), "image/jpeg", (1920, 1080)),
        (jpeg(1024, 768, exif_bytes=30_000), "image/jpeg", (1024, 768)),  # the frame after EXIF
    ],
)
def test_the_size_is_read_from_the_header(data, media_type, size):
    image = read_data_url(data_url(data, media_type))
    assert (image.width, image.height) == size
    assert image.size_bytes == len(data) and image.media_type == media_type


def pillow_size(data: bytes) -> tuple[int, int]:
    """The size Pillow (vLLM's decoder, in .venv-vllm) opens an image at; the test skips here
    (after its own assertions) where there is no .venv-vllm."""
    python = vllm_python_or_skip("Pillow's reading")
    code = "import io,sys;from PIL import Image;print(*Image.open(io.BytesIO(sys.stdin.buffer.read())).size)"
    out = subprocess.run([python, "-c", code], input=data, capture_output=True, check=True).stdout
    width, height = out.split()
    return int(width), int(height)


OPENED = [
    "DATA:image/png;base64,",  # a scheme is read in any case
    "Data:image/png;base64,",
    "data:image/png;name=cat.png;base64,",  # parameters (RFC 2397)
    "data:application/octet-stream;base64,",  # the bytes say the format, not the media type
    "data:;base64,",
    "data:image/jpeg;base64,",  # a PNG said to be a JPEG is a PNG
]
NOT_BASE64 = [
    "data:image/png,",
    "data:image/png;base64;charset=utf-8,",
    "data:base64,",
]  # vLLM: NotImplementedError


@pytest.mark.parametrize("prefix", OPENED)
def test_a_data_url_is_read_as_vllm_reads_it(prefix):
    """Each is an image vLLM 0.32 opens (test_vllm_opens_and_refuses_the_same_data_urls): the
    router prices it and the simulated engine serves it, as vLLM would."""
    url = prefix + base64.b64encode(png(448, 448)).decode()
    assert (read_data_url(url).width, read_data_url(url).height) == (448, 448)
    counted = count_images([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
    assert counted.image_tokens == 256


@pytest.mark.vllm
def test_vllm_opens_and_refuses_the_same_data_urls():
    """The installed vLLM's media connector on the same URLs: the ones read above open at 448 x
    448, the ones refused above (not base64) raise."""
    python = vllm_python_or_skip("vLLM's reading")
    payload = base64.b64encode(png(448, 448)).decode()
    code = (
        "import sys\n"
        "from vllm.multimodal.media.connector import MediaConnector\n"
        "from vllm.multimodal.media.image import ImageMediaIO\n"
        "for url in sys.stdin.read().split():\n"
        "    try:\n"
        "        print(*MediaConnector().load_from_url(url, ImageMediaIO()).media.size)\n"
        "    except Exception as e:\n"
        "        print(type(e).__name__)\n"
    )
    urls = "\n".join(prefix + payload for prefix in OPENED + NOT_BASE64)
    out = subprocess.run([python, "-c", code], input=urls.encode(), capture_output=True, check=True)
    assert out.stdout.decode().splitlines() == ["448 448"] * len(OPENED) + ["NotImplementedError"] * len(
        NOT_BASE64
    )
    for prefix in NOT_BASE64:
        with pytest.raises(ImageError, match=";base64,<data>"):
            read_data_url(prefix + payload)


def test_only_the_header_is_decoded(decoded):
    big = png(2000, 2000)  # ~8 KB compressed, 4 MB of pixels
    assert (read_data_url(data_url(big)).width, sum(decoded)) == (2000, 32)  # 24 bytes: 32 chars
    decoded.clear()
    read_data_url(data_url(jpeg(1024, 768, exif_bytes=60_000), "image/jpeg"))
    assert sum(decoded) < 200  # windows of 64 characters: the 60 KB EXIF segment is jumped over


def test_a_gif_is_sized_as_pillow_opens_it():
    """Pillow (vLLM's decoder) opens a GIF at its first frame's extent when it overflows the
    logical screen; the router's price follows (1,044 image tokens, not 4 from a 1 x 1 screen)."""
    data = gif(1, 1, frame=(0, 0, 1000, 800))
    counted = count_images([{"role": "user", "content": [image_part(data, "image/gif")]}])
    assert counted.image_tokens == image_tokens(1000, 800) == 1044
    assert pillow_size(data) == (1000, 800)


@pytest.mark.parametrize(
    "junk",
    [b"\x00", b"\x00" * 100, bytes(range(255)) * 20, b"junk\xff\xff", b"\xff\x00\xff\x00"],
    ids=["one byte", "100 zeros", "5,100 bytes", "junk then fill", "escaped 0xFF"],
)
def test_a_jpeg_with_junk_between_segments_is_sized_as_pillow_opens_it(junk):
    """Pillow (vLLM's decoder) skips bytes between segments to the next 0xFF and steps over an
    escaped 0xFF (FF 00); the reader does too, a block a run."""
    data = jpeg(1024, 768, exif_bytes=100, junk=junk)
    image = read_data_url(data_url(data, "image/jpeg"))
    assert (image.width, image.height) == (1024, 768)
    assert pillow_size(data) == (1024, 768)


FAKE_SOF = b"\xff\xc0\x00\x11\x08\x00\x10\x00\x10\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"  # 16 x 16
REAL_SOF = b"\xff\xc0\x00\x11\x08\x07\xd0\x07\xd0\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"  # 2000 x 2000


def test_an_eoi_and_soi_before_the_frame_are_stepped_over_as_pillow_does():
    """EOI + SOI (FF D9 FF D8) before the frame: Pillow steps over both (libjpeg decodes the
    frame after them), so must the reader. Read as a segment's length, FF D9 jumped 65,498 bytes
    onto a fake 16 x 16 frame a tenant put there in a comment: 4 image tokens for 1,225 (found by
    a hostile review)."""
    head = b"\xff\xd8\xff\xd9\xff\xd8"
    land = 2 + 2 + 0xFFD8  # where a walker that reads FF D9's "length" lands
    comment = bytearray(b"\x20" * (land - (len(head) + 4) + len(FAKE_SOF) + 8))
    comment[land - (len(head) + 4) : land - (len(head) + 4) + len(FAKE_SOF)] = FAKE_SOF
    data = head + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + bytes(comment) + REAL_SOF + bytes(64)
    image = read_data_url(data_url(data, "image/jpeg"))
    assert (image.width, image.height) == (2000, 2000)
    assert pillow_size(data) == (2000, 2000)


def test_a_non_ascii_character_in_the_base64_is_a_400_naming_the_part():
    """binascii raises ValueError, not binascii.Error, for it: it was a 500 (hostile review)."""
    url = "data:image/png;base64,\u00e9VBORw0KGgoAAAANSUhEUgAAAcAAAAHAAAAAAAAA"
    err = _refusal({"type": "image_url", "image_url": {"url": url}})
    assert err.status == 400 and err.param == "messages[0].content[1].image_url.url"


def test_a_gif_without_an_image_is_refused():
    with pytest.raises(ImageError, match="no image"):
        read_data_url(data_url(gif(4, 4)[:-16] + b";", "image/gif"))  # its image cut, then the trailer


def test_image_tokens_follow_the_processors_resize():
    assert image_tokens(448, 448) == 256  # 16 x 16 cells of 28 px
    assert image_tokens(1024, 768) == 37 * 27  # 1,036 x 756
    assert image_tokens(1920, 1080) == 47 * 26  # capped at 1,280 tokens: 1,316 x 728
    assert image_tokens(20, 20) == 4  # raised to the 56 x 56 minimum


def test_a_chat_counts_its_images_and_their_tokens():
    a, b = png(448, 448), jpeg(1024, 768)
    messages = [
        {"role": "system", "content": "look"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "these"}, image_part(a), image_part(b, "image/jpeg")],
        },
    ]
    assert count_images(messages) == ImageCount(2, 256 + 999, len(a) + len(b))
    assert count_images([{"role": "user", "content": "no images"}]) == NO_IMAGES
    assert count_images("not a list") == NO_IMAGES


def _refusal(part: object) -> RequestError:
    with pytest.raises(RequestError) as caught:
        count_images([{"role": "user", "content": ["hi", part]}])
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("https://example.com/cat.png", "not 'https'"),
        ("http://10.0.0.1/x.png", "not 'http'"),
        ("file:///etc/passwd", "not 'file'"),
        ("cat.png", "no scheme"),
    ],
)
def test_a_remote_url_is_refused_naming_the_part(url, said):
    err = _refusal({"type": "image_url", "image_url": {"url": url}})
    assert err.param == "messages[0].content[1].image_url.url"
    assert said in err.message and "does not fetch" in err.message


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("data:image/png;base64,", "multiple of 4"),
        ("data:image/png;base64,abc", "multiple of 4"),
        ("data:image/png;base64,!!!!", "not valid base64"),
        ("data:image/svg+xml;base64," + base64.b64encode(b"<svg></svg>").decode(), "not a PNG"),
        ("data:image/png,rawbytes", ";base64,<data>"),
        ("data:image/png;base64;charset=utf-8,AAAA", ";base64,<data>"),  # base64 last, as vLLM asks
        ("data:image/png;base64," + base64.b64encode(b"not an image at all, really").decode(), "not a PNG"),
        ("data:image/png;base64," + base64.b64encode(png(4, 4)[:20]).decode(), "ends before its header"),
        (data_url(png(0, 5)), "1 to 16384 pixels"),
        (data_url(png(20_000, 1)), "1 to 16384 pixels"),
        (data_url(jpeg(10, 10)[:-15], "image/jpeg"), "ends before"),
    ],
)
def test_a_malformed_data_url_is_a_400_naming_the_part(url, said):
    err = _refusal({"type": "image_url", "image_url": {"url": url}})
    assert err.param == "messages[0].content[1].image_url.url" and said in err.message


def test_an_image_part_without_a_url_string_is_refused():
    assert _refusal({"type": "image_url", "image_url": {}}).param == "messages[0].content[1].image_url.url"
    assert _refusal({"type": "image_url", "image_url": {"url": 5}}).param.endswith(".url")


@pytest.mark.parametrize(
    ("part", "tokens"),
    [
        # vLLM reads a part without "type" (or with a "uuid") by its first media field; without
        # a uuid its validation takes only a bare URL string (or null), an object is refused
        ({"image_url": data_url(png(1344, 1344))}, image_tokens(1344, 1344)),
        ({"type": None, "image_url": data_url(png(448, 448))}, 256),
        ({"image_url": {"url": data_url(png(448, 448))}}, 0),
        # valid as a bare audio URL (null), then read by its first media field: an image
        ({"image_url": {"url": data_url(png(448, 448))}, "audio_url": None}, 256),
        ({"type": "text", "image_url": {"url": data_url(png(448, 448))}, "uuid": "u"}, 256),
        # an input_image's URL is its own "image_url" string (ResponseInputImageParam)
        ({"type": "input_image", "image_url": data_url(png(448, 448))}, 256),
    ],
)
def test_an_image_part_is_counted_as_vllm_reads_it(part, tokens):
    assert count_images([{"role": "user", "content": ["hi", part]}]).image_tokens == tokens


def test_a_text_part_with_an_image_field_is_text_as_vllm_reads_it():
    part = {"type": "text", "text": "t", "image_url": {"url": "http://10.0.0.1/x.png"}}
    assert count_images([{"role": "user", "content": [part]}]) == NO_IMAGES


PNG_URL = data_url(png(4, 4))
READ_AS = [
    ({"image_url": PNG_URL}, "image_url"),
    ({"type": None, "image_url": PNG_URL}, "image_url"),
    ({"image_url": None}, "image_url"),
    ({"video_url": "http://10.0.0.1/a.mp4"}, "video_url"),
    ({"image_url": {"url": PNG_URL}, "audio_url": None}, "image_url"),
    ({"type": "text", "text": "hi"}, "text"),
    ({"type": "image_url", "image_url": {"url": PNG_URL}}, "image_url"),
    ({"image_url": {"url": PNG_URL}}, None),
    ({"type": None, "image_url": {"url": PNG_URL}}, None),
    ({"text": "hi"}, None),
    ({"type": None, "text": "hi"}, None),
    ({"refusal": "no"}, None),
    ({"image_embeds": "AAAA"}, None),
    ({"tool_reference": "t"}, None),
    ({}, None),
    ({"type": 5, "text": "hi"}, None),
]


@pytest.mark.vllm
def test_vllm_validates_and_reads_a_part_as_part_kind_says():
    """The installed vLLM's chat request validation, then its part parser, on each part: the
    type it reads, or None where it refuses the part (the router's 400 for part_kind None)."""
    assert [part_kind(part) for part, _ in READ_AS] == [kind for _, kind in READ_AS]
    python = vllm_python_or_skip("vLLM's reading")
    code = (
        "import json, sys\n"
        "from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest\n"
        "from vllm.renderers.chat_utils import _parse_chat_message_content_mm_part\n"
        "for line in sys.stdin.read().splitlines():\n"
        "    body = {'model': 'm', 'messages': [{'role': 'user', 'content': [json.loads(line)]}]}\n"
        "    try:\n"
        "        part = list(ChatCompletionRequest.model_validate(body).messages[0]['content'])[0]\n"
        "        print(json.dumps(_parse_chat_message_content_mm_part(part)[0]))\n"
        "    except ValueError:\n"  # pydantic's ValidationError and vLLM's VLLMValidationError
        "        print('null')\n"
    )
    parts = "\n".join(json.dumps(part) for part, _ in READ_AS)
    out = subprocess.run([python, "-c", code], input=parts.encode(), capture_output=True, check=True)
    assert [json.loads(line) for line in out.stdout.decode().splitlines()] == [kind for _, kind in READ_AS]


# Parts and the text vLLM reads from them: what the router prices (and bills a cut stream) as text.
TEXT_OF = [
    ({"type": "text", "text": "hello"}, "hello"),
    ({"type": "text", "text": "a", "refusal": "bbbb"}, "a"),  # only the type's own field
    ({"type": "refusal", "refusal": "no", "text": "ignored"}, "no"),
    ({"type": "thinking", "thinking": "hmm"}, "hmm"),
    ({"type": "tool_reference", "name": "get_weather"}, "get_weather"),
    ({"type": "image_url", "image_url": {"url": PNG_URL}, "text": "x" * 400}, None),  # not read
    ({"image_url": PNG_URL, "text": "x" * 400}, None),
]


# In the installed vLLM's python: each part (a line of JSON) through its chat request validation
# and its part parser, with a media parser that takes anything (text parts ask only its
# model_config); first its parser's types, then per part {"read": what it reads} or {"refused": 1}.
READ_PARTS = (
    "import json, sys, types\n"
    "from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest\n"
    "from vllm.renderers import chat_utils\n"
    "class Parser:\n"
    "    model_config = types.SimpleNamespace(enable_prompt_embeds=False)\n"
    "    def __getattr__(self, name):\n"
    "        return lambda *args: None\n"
    "print(json.dumps(sorted(chat_utils.MM_PARSER_MAP)))\n"
    "for line in sys.stdin.read().splitlines():\n"
    "    body = {'model': 'm', 'messages': [{'role': 'user', 'content': [json.loads(line)]}]}\n"
    "    try:\n"
    "        part = list(ChatCompletionRequest.model_validate(body).messages[0]['content'])[0]\n"
    "        read = chat_utils._parse_chat_message_content_part(\n"
    "            part, Parser(), wrap_dicts=False, interleave_strings=False)\n"
    "        print(json.dumps({'read': read}))\n"
    "    except ValueError:\n"  # pydantic's ValidationError and vLLM's VLLMValidationError
    "        print(json.dumps({'refused': 1}))\n"
)


def vllm_reads(parts: list[dict], what: str) -> tuple[list[str], list[dict]]:
    """The installed vLLM's parser types, and how it reads each part (READ_PARTS)."""
    python = vllm_python_or_skip(what)
    lines = "\n".join(json.dumps(part) for part in parts).encode()
    out = subprocess.run([python, "-c", READ_PARTS], input=lines, capture_output=True, check=True)
    first, *each = out.stdout.decode().splitlines()
    return json.loads(first), [json.loads(line) for line in each]


@pytest.mark.vllm
def test_the_text_priced_of_a_part_is_the_text_vllm_reads():
    assert [part_text(part) for part, _ in TEXT_OF] == [text for _, text in TEXT_OF]
    _, reads = vllm_reads([part for part, _ in TEXT_OF], "vLLM's part text")
    assert reads == [{"read": text} for _, text in TEXT_OF]


# A part of each type vLLM's parser knows, and of some it does not: the router lets through
# only CHAT_PART_TYPES (refusing the rest: test_priced_parameters).
SAMPLE_PARTS = {
    "text": {"type": "text", "text": "a"},
    "input_text": {"type": "input_text", "text": "a"},
    "output_text": {"type": "output_text", "text": "a"},
    "thinking": {"type": "thinking", "thinking": "a"},
    "refusal": {"type": "refusal", "refusal": "a"},
    "input_image": {"type": "input_image", "image_url": PNG_URL, "detail": "auto"},
    "image_url": {"type": "image_url", "image_url": {"url": PNG_URL}},
    "image_pil": {"type": "image_pil", "image_pil": None},
    "image_embeds": {"type": "image_embeds", "image_embeds": "AAAA"},
    "audio_embeds": {"type": "audio_embeds", "audio_embeds": "AAAA"},
    "video_embeds": {"type": "video_embeds", "video_embeds": "AAAA"},
    "prompt_embeds": {"type": "prompt_embeds", "data": "AAAA"},
    "audio_url": {"type": "audio_url", "audio_url": {"url": PNG_URL}},
    "input_audio": {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    "video_url": {"type": "video_url", "video_url": {"url": PNG_URL}},
    "tool_reference": {"type": "tool_reference", "name": "get_weather"},
    **{kind: {"type": kind, "text": "a"} for kind in ("blob", "file", "TEXT", "image")},
}


@pytest.mark.vllm
def test_the_part_types_the_router_lets_through_are_the_ones_vllms_chat_reads():
    """VLLM_PART_TYPES is the installed vLLM's MM_PARSER_MAP; of a chat message's parts, its
    validation and parser read those of CHAT_PART_TYPES and refuse every other."""
    assert set(SAMPLE_PARTS) >= VLLM_PART_TYPES
    types, reads = vllm_reads(list(SAMPLE_PARTS.values()), "vLLM's part types")
    assert types == sorted(VLLM_PART_TYPES)
    assert {kind: "refused" not in read for kind, read in zip(SAMPLE_PARTS, reads, strict=True)} == {
        kind: kind in CHAT_PART_TYPES for kind in SAMPLE_PARTS
    }


AT = "messages[0].content[1]"  # the part after "hi"


@pytest.mark.parametrize(
    ("part", "param"),
    [
        ({"image_url": "http://169.254.169.254/latest/meta-data/"}, f"{AT}.image_url"),
        ({"type": "image_url", "image_url": {"url": "http://10.0.0.1/x.png"}, "uuid": "u"},
         f"{AT}.image_url.url"),
        ({"type": "input_image", "image_url": "https://example.com/a.png"}, f"{AT}.image_url"),
        ({"type": "input_image", "image_url": {"url": data_url(png(4, 4))}}, f"{AT}.image_url"),
        ({"type": "video_url", "video_url": {"url": "http://10.0.0.1/big.mp4"}}, AT),
        ({"type": "audio_url", "audio_url": {"url": "http://10.0.0.1/a.wav"}}, AT),
        ({"video_url": "data:video/mp4;base64,AAAA"}, AT),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, AT),
        ({"type": "image_embeds", "image_embeds": "AAAA"}, AT),
        ({"type": "text", "text": "t", "uuid": "u", "audio_url": "http://10.0.0.1/a.wav"}, AT),
    ],
)  # fmt: skip
def test_a_media_part_the_router_cannot_price_or_fetch_is_refused_naming_it(part, param):
    assert _refusal(part).param == param


def test_too_many_images_are_refused():
    part = image_part(png(28, 28))
    with pytest.raises(RequestError) as caught:
        count_images([{"role": "user", "content": [part] * 65}])
    assert caught.value.param == "messages" and "64" in caught.value.message


def test_a_huge_payload_is_refused_from_its_length_alone():
    with pytest.raises(ImageError, match="at most"):
        read_data_url("data:image/png;base64," + "A" * (28 * 1024 * 1024))
