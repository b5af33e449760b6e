"""dataplane.wire.json_depth against the parsed document's own depth: brackets, quotes and
backslashes inside strings never count, whatever the nesting (hypothesis)."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.wire import json_depth

TRICKY = st.text(alphabet='[]{}"\\ab\n\u00e9', max_size=8)
DOCS = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=40,
)


def depth_of(doc) -> int:
    if isinstance(doc, dict):
        return 1 + max((depth_of(v) for v in doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max((depth_of(v) for v in doc), default=0)
    return 0


@settings(max_examples=500)
@given(DOCS, st.integers(min_value=0, max_value=6), st.booleans())
def test_the_byte_scan_agrees_with_the_parsed_depth(doc, limit, ascii_only):
    raw = json.dumps(doc, ensure_ascii=ascii_only).encode()
    assert json_depth.deeper_than(raw, limit) == (depth_of(doc) > limit)


def test_a_pathological_body_is_refused_before_the_parser_recurses():
    for raw in (b"[" * 100_000, b'{"a":' * 100_000, b"[" * 129 + b"]" * 129):
        try:
            json_depth.loads(raw)
        except json_depth.TooDeep as exc:
            assert str(exc) == "the JSON body is nested deeper than 128 levels"
        else:
            raise AssertionError("not refused")
    assert json_depth.loads(b"[" * 128 + b"]" * 128) is not None
