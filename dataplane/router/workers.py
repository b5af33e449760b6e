"""Readiness across the processes of a ``--workers N`` router.

The workers share one port (SO_REUSEPORT), so a readiness probe lands on any one of them, and
each loads its routing table on its own. A worker that has its table would answer 200 while a
sibling still answers every request it gets 503 "no routing table yet": the pod would take
traffic too early. So each worker marks its byte in memory shared across the fork when its
table is loaded, and a worker's ``/health`` is ready only when every byte is set. A worker
that dies leaves its byte set: the kernel stops sending it connections, and the others serve.
"""

from __future__ import annotations

import mmap


class WorkerReadiness:
    """One byte per worker, in an anonymous shared mapping made before the fork."""

    def __init__(self, workers: int, index: int = 0, slots: mmap.mmap | None = None) -> None:
        self.slots = slots if slots is not None else mmap.mmap(-1, workers)  # MAP_SHARED
        self.index = index

    def of_worker(self, index: int) -> WorkerReadiness:
        """The same bytes, seen by worker ``index``."""
        return WorkerReadiness(len(self.slots), index, self.slots)

    def mark_ready(self) -> None:
        self.slots[self.index] = 1

    def all_ready(self) -> bool:
        return all(self.slots[:])
