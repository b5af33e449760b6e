"""What sizing a request's images costs the router, in CPU time (time.process_time), this tree
against BASE_REF (default main, exported with git archive), side by side in one run.

    PYTHONPATH=. .venv/bin/python bench/router_image_sizing.py [--base-ref main] [--repeats 3] [--rounds 3]
                                                               [--smoke]

Each case (``cases``) is one chat request body, run through the router's pricing path as
``Router.proxy`` runs it before admission (``json_body``, ``demand`` with its image count,
``estimate_input_tokens``, ``pod_body``), beside a text request of the same byte size. Printed:
microseconds of CPU per request (the least of ``--repeats`` runs of each tree, taken in turn, of
``--rounds`` rounds each), the ratio to the same-size text request, the image count alone
(``count_images`` on the parsed messages), and whether the request was priced or refused (a 400
and its param; a refused case's cost is the refusal's). --smoke: one run of one round each,
against HEAD (a checkout may have no main), in seconds: does it still run, not what it gives.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _screen(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"


def _frame(data_bytes: int) -> bytes:
    """A 64 x 64 image descriptor, then ``data_bytes`` of image data in 255-byte sub-blocks."""
    sizes = [min(255, data_bytes - k) for k in range(0, data_bytes, 255)]
    data = b"".join(bytes([n]) + b"\x00" * n for n in sizes)
    return b"\x2c" + struct.pack("<HHHHB", 0, 0, 64, 64, 0) + b"\x02" + data + b"\x00;"


def _gif(extensions: int, size: int = 0) -> bytes:
    """A 1 x 1 GIF of ``extensions`` empty comment extensions, then its frame, padded in the
    frame's image data to ``size`` bytes (to about that: a sub-block's length byte each)."""
    head = _screen(1, 1) + b"\x21\xfe\x00" * extensions
    return head + _frame(max(4, size - len(head) - len(_frame(0)) - size // 256))


def _honest_gif(size: int) -> bytes:
    head = (
        _screen(64, 64) + b"\x21\xf9\x04\x00\x00\x00\x00\x00" + b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00"
    )
    return head + _frame(max(4, size - len(head) - len(_frame(0)) - size // 256))


def _jpeg(segments: int, tail: int = 0, exif: int = 0) -> bytes:
    """SOI, ``segments`` empty COM segments, an EXIF segment of ``exif`` bytes, a quantization
    table, the 1,024 x 768 frame header, ``tail`` bytes of scan data, EOI."""
    out = b"\xff\xd8" + b"\xff\xfe\x00\x02" * segments
    if exif:
        out += b"\xff\xe1" + struct.pack(">H", exif + 2) + b"\x00" * exif
    out += b"\xff\xdb\x00\x43\x00" + bytes(range(1, 65))
    out += b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 768, 1024, 1) + b"\x01\x11\x00"
    return out + os.urandom(tail) + b"\xff\xd9"


def _png(size: int) -> bytes:
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", 2048, 1536, 8, 2, 0, 0, 0)
    idat = b"IDAT" + os.urandom(size)  # no reader looks past IHDR
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", 13)
        + ihdr
        + b"\0" * 4
        + struct.pack(">I", size)
        + idat
        + b"\0" * 4
    )


def _chat(images: list[tuple[bytes, str]]) -> bytes:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": f"data:{kind};base64,{base64.b64encode(data).decode()}"}}
        for data, kind in images
    ]
    parts.append({"type": "text", "text": "what is in these?"})
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": parts}], "max_tokens": 16}
    ).encode()


def _text(size: int) -> bytes:
    empty = json.dumps({"model": "m", "messages": [{"role": "user", "content": ""}], "max_tokens": 16})
    return empty.replace('"content": ""', '"content": "' + "x" * (size - len(empty)) + '"').encode()


def cases() -> dict[str, bytes]:
    """The request bodies, by name:

    - gif-attack: 64 GIFs of 1,567 bytes, each 510 empty comment extensions before its frame (3
      bytes each, two blocks walked), the most the old per-image cap (1,024 blocks) let through;
    - gif-worst: 64 GIFs of the same 1,567 bytes, each with the most empty extensions this tree
      prices (79, a block each, and the frame: the 32 + 1,567 / 32 = 80 allowed), the rest in
      image data (an empty extension is the costliest block a walk takes);
    - gif-honest: 64 GIFs of the same 1,567 bytes, a graphic control and a NETSCAPE looping
      extension before the frame, the rest in image data (which no reader walks);
    - gif-small-worst: 64 GIFs of 35 empty extensions and a 4-byte frame (142 bytes, 36 blocks):
      about the most blocks per byte a priced request walks;
    - jpeg-worst: 64 JPEGs of the most empty COM segments before the frame this tree prices (37
      in 234 bytes; the old cap was 64 segments), against jpeg-honest, 64 JPEGs of the same size
      (a quantization table, the frame header, scan data);
    - gif-request-worst: 64 GIFs of 3 KB and 127 empty extensions each, 8,192 blocks: all a
      request's images may walk together (router.images.MAX_REQUEST_BLOCKS), in the fewest bytes;
    - gif-1mb-worst: one GIF of 1 MiB and 8,191 empty extensions, the request's budget in one image;
    - png-8mb, jpeg-8mb: one 8 MB image (the JPEG with a 60 KB EXIF segment before its frame),
      11 MB of base64.
    """
    attack = _gif(510)
    size = len(attack)
    # the most blocks this tree walks, 32 + 1 per 32 bytes: 1 an empty comment, 1 for the frame
    worst, honest = _gif(32 + size // 32 - 1, size), _honest_gif(size)
    small = _gif(max(k for k in range(100) if k + 1 <= 32 + len(_gif(k)) // 32))
    big = _gif(8191, 1 << 20)  # 8,192 blocks: all a request's images may walk together
    # 64 images of 128 blocks: 8,192 in the fewest bytes (3 KB an image)
    share = next(g for n in range(3000, 4000) if 128 <= 32 + len(g := _gif(127, n)) // 32)
    assert len(worst) == len(honest) == size, (size, len(worst), len(honest))
    # 1 block per COM segment, 1 for the quantization table and 1 for the frame header
    jpeg_worst = _jpeg(max(k for k in range(200) if k + 2 <= 32 + len(_jpeg(k)) // 32))
    jpeg_honest = _jpeg(0, len(jpeg_worst) - len(_jpeg(0)))
    return {
        "gif-attack": _chat([(attack, "image/gif")] * 64),
        "gif-worst": _chat([(worst, "image/gif")] * 64),
        "gif-honest": _chat([(honest, "image/gif")] * 64),
        "gif-small-worst": _chat([(small, "image/gif")] * 64),
        "jpeg-worst": _chat([(jpeg_worst, "image/jpeg")] * 64),
        "jpeg-honest": _chat([(jpeg_honest, "image/jpeg")] * 64),
        "gif-request-worst": _chat([(share, "image/gif")] * 64),
        "gif-1mb-worst": _chat([(big, "image/gif")]),
        "png-8mb": _chat([(_png(8 << 20), "image/png")]),
        "jpeg-8mb": _chat([(_jpeg(0, 8 << 20, exif=60_000), "image/jpeg")]),
    }


def _cpu_us(run: Any, rounds: int) -> float:
    """The least CPU microseconds of one call, over ``rounds`` rounds of at least 50 ms each (the
    least: another process on the machine only ever adds to it)."""
    run()  # warm
    start = time.process_time()
    run()
    calls = max(1, int(0.05 / max(time.process_time() - start, 1e-6)))
    timings = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            run()
        timings.append((time.process_time() - start) / calls * 1e6)
    return min(timings)


def measure(rounds: int) -> dict[str, Any]:
    """This process's tree: each case through the pricing path and its image count alone, and a
    text request of the same size through the pricing path."""
    from dataplane.router.http import RequestError
    from dataplane.router.images import count_images
    from dataplane.router.pricing import estimate_input_tokens
    from dataplane.router.proxy import pod_body
    from dataplane.router.server import json_body
    from dataplane.router.validation import demand

    def path(raw: bytes) -> str:
        try:
            body, _ = json_body(raw)
            asked = demand(body, True, 32768, 8, 256)
            estimate_input_tokens(body, True)
            pod_body(raw, body)
        except RequestError as error:
            return f"400 {error.param}"
        return f"{asked.images.images} images, {asked.images.image_tokens} tokens"

    def sizing(messages: Any) -> None:
        try:
            count_images(messages)
        except RequestError:
            pass

    out = {}
    for name, raw in cases().items():
        text, messages = _text(len(raw)), json.loads(raw)["messages"]
        out[name] = {
            "bytes": len(raw),
            "us": _cpu_us(lambda raw=raw: path(raw), rounds),
            "sizing_us": _cpu_us(lambda messages=messages: sizing(messages), rounds),
            "text_us": _cpu_us(lambda text=text: path(text), rounds),
            "answer": path(raw),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-ref", default="main")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each tree, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each case in a run")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # a tree's directory: measure it
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: 1 x 1 against HEAD")
    args = parser.parse_args()
    if args.smoke:  # again, with these as the defaults (an explicit argument still wins)
        parser.set_defaults(base_ref="HEAD", repeats=1, rounds=1)
        args = parser.parse_args()
    if args.measure:
        sys.path.insert(0, args.measure)
        print(json.dumps(measure(args.rounds)))
        return
    results: dict[str, dict[str, Any]] = {"base": {}, "this": {}}
    with tempfile.TemporaryDirectory() as base:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.base_ref], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", base], input=archive.stdout, check=True)
        for _ in range(args.repeats):  # alternating, so a change in the machine's load bends both
            for label, tree in (("base", base), ("this", str(ROOT))):
                cmd = [sys.executable, __file__, "--measure", tree, "--rounds", str(args.rounds)]
                env = {**os.environ, "PYTHONPATH": tree}
                run = json.loads(subprocess.run(cmd, capture_output=True, check=True, env=env).stdout)
                for name, got in run.items():
                    kept = results[label].setdefault(name, got)
                    for key in ("us", "sizing_us", "text_us"):
                        kept[key] = min(kept[key], got[key])
    print(
        f"CPU us per request (least of {args.repeats} x {args.rounds}); base = {args.base_ref}, this = here"
    )
    print("  path: the pricing path; x text: over a text request of the same size; sizing: count_images")
    columns = f"{'path':>10}{'x text':>7}{'sizing':>9}"
    print(f"{'case':<16}{'bytes':>11} | base{columns} | this{columns}  this answer")
    for name, t in results["this"].items():
        b = results["base"][name]
        answer = t["answer"] if t["answer"] == b["answer"] else f"{t['answer']} (base: {b['answer']})"
        print(
            f"{name:<16}{t['bytes']:>11,} |     {b['us']:>10.1f}{b['us'] / b['text_us']:>7.2f}"
            f"{b['sizing_us']:>9.1f} |     {t['us']:>10.1f}{t['us'] / t['text_us']:>7.2f}"
            f"{t['sizing_us']:>9.1f}  {answer}"
        )
    for worst, honest in (
        ("gif-attack", "gif-honest"),
        ("gif-worst", "gif-honest"),
        ("jpeg-worst", "jpeg-honest"),
    ):
        b, t = (results[tree][worst]["us"] / results[tree][honest]["us"] for tree in ("base", "this"))
        print(f"{worst} / {honest} (same size, path): base {b:.2f}, this {t:.2f}")
    for name in ("gif-attack", "gif-worst", "jpeg-worst", "png-8mb"):
        b, t = (results[tree][name]["sizing_us"] for tree in ("base", "this"))
        print(f"{name} sizing: base / this = {b / t:.1f}")


if __name__ == "__main__":
    main()
