"""JSON from a client, parsed only when it nests no deeper than a bound. Pure: no I/O.

Python's json module recurses once per level of nesting: 100,000 ``[`` raise RecursionError (not
the ValueError a server answers with a 400), and a body just under the interpreter's limit parses
but leaves too little stack for what walks it next (validation, ``json.dumps`` to a pod). ``loads``
measures the nesting on the bytes first (strings skipped, in C-speed passes: the bracket count
alone decides for almost every body) and refuses a deeper one with ``TooDeep``, a ValueError, so
every caller that answers bad JSON with a 400 answers this one too; the parser's own
RecursionError is the same ``TooDeep``, whatever the text's encoding.

``MAX_DEPTH`` is 128 levels (``{"a": [1]}`` is two). The deepest part of a real request is a
tool's JSON schema: each schema level costs two JSON levels (``properties`` -> the property's
schema), so a schema 20 levels deep, deeper than any API we know of generates, is about 45 JSON
levels under the request's own 5 (body -> tools -> [i] -> function -> parameters); 128 leaves
more than twice that, and stays far below Python's recursion limit (1,000 frames), so nothing
after the parse can run out of stack.
"""

import json
from array import array
from itertools import accumulate
from typing import Any

MAX_DEPTH = 128

# Every byte but quotes and brackets dropped; an opening bracket made 1 and a closing one 255
# (-1 as a signed byte), so that the depth at each bracket is a running sum (a mismatched pair is
# the parser's to refuse).
_KEPT = b'"[]{}'
_DROPPED = bytes(b for b in range(256) if b not in _KEPT)
_STEPS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")


class TooDeep(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the JSON body is nested deeper than {limit} levels")
        self.limit = limit


def deeper_than(raw: bytes, limit: int) -> bool:
    """Whether a JSON text's arrays and objects nest deeper than `limit` (brackets inside strings do
    not count), in passes at C speed over the bytes."""
    if raw.count(b"[") + raw.count(b"{") <= limit:  # almost every body: no scan at all
        return False
    # Escaped backslashes first (so that in \\" the quote ends the string), then escaped quotes:
    # every quote left opens or closes a string.
    structure = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _DROPPED)
    # Two quotes side by side close a string and open the next (or hold nothing): dropping them
    # keeps every other quote an opening one; then what lies between quotes is strings' content.
    outside = b"".join(structure.replace(b'""', b"").split(b'"')[::2])
    steps = array("b", outside.translate(_STEPS))
    return max(accumulate(steps), default=0) > limit


def loads(raw: bytes | str, limit: int = MAX_DEPTH) -> Any:
    """``json.loads``, refusing a text nested deeper than `limit` with ``TooDeep``."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if deeper_than(data, limit):
        raise TooDeep(limit)
    try:
        return json.loads(raw)
    except RecursionError:  # a text the byte scan misread (UTF-16, say): the parser's own limit
        raise TooDeep(limit) from None
