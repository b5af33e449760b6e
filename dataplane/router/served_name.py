"""A renamed endpoint's requests and answers: its pods serve one name, its clients ask for another.

Pods serve the name their endpoint was created under (``--served-model-name``; the routing
table's ``served_model_name``), and a rename keeps it, so a rename restarts no pod and no request
meets a pod that does not know the name it asked for. The router sends the pod its served name
(``proxy.pod_body``) and puts the asked one back in the answer (``AnswerName``): vLLM writes its
served name as the ``"model"`` of every JSON answer and every stream chunk. Pods started with
both names would not do: vLLM takes several (``--served-model-name old new``) but answers with
the first, whatever the request named (``OpenAIModelRegistry.model_name``), and a new name
restarts every pod.

An endpoint never renamed, most of them, costs nothing here: its body goes as it came and its
answer is not read. A renamed one costs a dump of its body and a replace per read of its answer.
"""

from __future__ import annotations

import json

from dataplane.wire.routing_table import RoutedEndpoint

# The key as vLLM (pydantic's compact dump) and the simulated engine (json.dumps) write it. Every
# quote inside a JSON string is escaped, so what follows it matches only as a member.
_KEYS = (b'"model":', b'"model": ')


def served_instead(spec: RoutedEndpoint, asked: str) -> str | None:
    """The name the endpoint's pods serve when the request ``asked`` for it by another (it was
    renamed), else None; a static table's endpoint names none: its pods serve what is asked."""
    served = spec.served_model_name
    return served if served and served != asked else None


class AnswerName:
    """Puts the name a request asked for back in the pod's answer, in place of the served one:
    in whole answers and whole stream events (``whole``), or in a body passing through read by
    read (``feed``, then ``end``), where a member split across two reads waits for the second."""

    __slots__ = ("_pairs", "_tail")

    def __init__(self, served: str, asked: str) -> None:
        old, new = json.dumps(served).encode(), json.dumps(asked).encode()
        self._pairs = tuple((key + old, key + new) for key in _KEYS)  # (served member, asked member)
        self._tail = b""  # the end of the last read, which may begin a member

    def whole(self, data: bytes) -> bytes:
        """``data`` (whole answers or events) with each served member naming the one asked."""
        for served, asked in self._pairs:
            data = data.replace(served, asked)
        return data

    def feed(self, data: bytes) -> bytes:
        """What of the next read goes on now: all of it but an end that may begin a member."""
        data = self.whole(self._tail + data if self._tail else data)
        cut = self._unfinished(data)
        self._tail = data[cut:]
        return data[:cut]

    def end(self) -> bytes:
        """The body ended: what was held goes on."""
        tail, self._tail = self._tail, b""
        return tail

    def _unfinished(self, data: bytes) -> int:
        """Where the longest end of ``data`` that begins a served member starts (len: none).
        Every member begins with a quote: only the quotes near the end are tried."""
        longest = max(len(served) for served, _ in self._pairs)
        at = data.find(b'"', max(0, len(data) - longest + 1))
        while at >= 0:
            end = data[at:]
            if any(served.startswith(end) for served, _ in self._pairs):
                return at
            at = data.find(b'"', at + 1)
        return len(data)
