"""JSON from a client, parsed only when it nests no deeper than a bound. Pure: no I/O.

Python's json module recurses once per level of nesting: 100,000 ``[`` raise RecursionError (not
the ValueError a server answers with a 400), and a body just under the interpreter's limit parses
but leaves too little stack for what walks it next (validation, ``json.dumps`` to a pod). ``loads``
measures the nesting on the bytes first (strings skipped, in C: the bracket count decides for
almost every body) and refuses a deeper one with ``TooDeep``, a ValueError, so every caller that
answers bad JSON with a 400 answers this one too; the parser's own RecursionError is the same
``TooDeep``, whatever the text's encoding.

``MAX_DEPTH`` is 128 levels (``{"a": [1]}`` is two). The deepest part of a real request is a
tool's JSON schema: each schema level costs two JSON levels (``properties`` -> the property's
schema), so a schema 20 levels deep, deeper than any API we know of generates, is about 45 JSON
levels under the request's own 5 (body -> tools -> [i] -> function -> parameters); 128 leaves
more than twice that, and stays far below Python's recursion limit (1,000 frames), so nothing
after the parse can run out of stack.
"""

import json
import re
from itertools import accumulate
from typing import Any

MAX_DEPTH = 128

# A JSON string, escapes included (possessive: no backtracking on a long one).
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class TooDeep(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the JSON body is nested deeper than {limit} levels")
        self.limit = limit


def depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text (brackets inside strings do not
    count); what is not JSON gets a number all the same, and the parser refuses it after."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def loads(raw: bytes | str, limit: int = MAX_DEPTH) -> Any:
    """``json.loads``, refusing a text nested deeper than `limit` with ``TooDeep``."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") > limit and depth(data) > limit:
        raise TooDeep(limit)
    try:
        return json.loads(raw)
    except RecursionError:  # a text the byte scan misread (UTF-16, say): the parser's own limit
        raise TooDeep(limit) from None
