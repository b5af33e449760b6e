"""Prometheus text exposition (format 0.0.4), the rules every scrape we serve follows.

Written by the router's ``/metrics`` and the simulated engine's, read by Prometheus,
``prometheus_client``'s parser and ``promtool check metrics``. A family is introduced by
``# HELP`` then ``# TYPE`` (``family_header``), and every label value is escaped
(``label_value``): a pod named ``chat-"quoted"-pod`` must not end its label early and make the
whole scrape unparseable.
"""

from __future__ import annotations

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def label_value(value: object) -> str:
    """``value`` as the inside of a quoted label value: backslash, double quote and line feed
    escaped, as the format requires (and nothing else: other bytes pass as UTF-8)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def family_header(name: str, kind: str, help_: str) -> list[str]:
    """The ``# HELP`` and ``# TYPE`` lines of a family; in HELP text backslash and line feed are
    escaped (a double quote is not, per the format)."""
    text = help_.replace("\\", "\\\\").replace("\n", "\\n")
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
