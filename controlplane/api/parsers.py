"""The API's JSON parser: DRF's, plus what no field may receive, checked once for every body.

A body is refused with a 400 naming where the problem is (``pool``, ``rows[0].tenant``, ``detail.note``)
when a string (a value or a key) holds a NUL character, which PostgreSQL text cannot store and SQLite
would store silently; when a number is not finite (``1e400`` parses to infinity); or when it is nested
deeper than ``API_MAX_JSON_DEPTH`` levels (``{"a": [1]}`` is two). The walk is iterative, and the
decoder's own RecursionError on a pathological depth is the same 400, so no body can blow the stack.
"""

import math
import re
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework import exceptions, parsers

NUL = "\x00"
NUL_MESSAGE = "must not contain a NUL (\\u0000) character"


def nul_message(name: str) -> str:
    return f"{name} {NUL_MESSAGE}"


def too_deep(limit: int) -> str:
    return f"the JSON body is nested deeper than {limit} levels"


def body_problem(doc: Any, max_depth: int) -> tuple[str, str] | None:
    """The first (where, what) wrong with a parsed body, or None. `where` is "" for the body itself."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, str):
            if NUL in value:
                return where, NUL_MESSAGE
        elif isinstance(value, float):
            if not math.isfinite(value):
                return where, f"must be a finite number, got {value!r}"
        elif isinstance(value, Mapping | list):
            if depth + 1 > max_depth:  # blamed on the top-level field it is under
                return re.split(r"[.\[]", where, maxsplit=1)[0] if where else "", too_deep(max_depth)
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and NUL in key:
                    return where or "body", f"has a key that {NUL_MESSAGE}"
                inner = f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{key}" if where else key)
                stack.append((item, inner, depth + 1))
    return None


class JSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.API_MAX_JSON_DEPTH
        try:
            doc = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError(too_deep(limit)) from None
        problem = body_problem(doc, limit)
        if problem is not None:
            where, what = problem
            raise exceptions.ValidationError({where: [what]} if where else [what])
        return doc
