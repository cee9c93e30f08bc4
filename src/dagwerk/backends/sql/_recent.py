"""Outputs a store object committed lately, kept for its own worker.

The next task of a chain reads exactly the outputs its parent just published,
and usually on the worker that published them: on SQLite that read was a
transaction of its own (three statements, some 5 % of a hop), on PostgreSQL
a round trip. :class:`RecentOutputs` keeps the stored text of the outputs this
store object committed, up to a byte budget (the oldest go first), so the
worker can resolve a claimed task's inputs without reading them again.

Only committed outputs enter (the store adds them after the commit that
wrote them; a unit of work's rolled-back writes never), and a stored output
never changes: it can only be invalidated later, by a reset or a retry of
its node, which also invalidates every task planned from it. A task whose
inputs come from here may therefore meet an output invalidated since, just
as it would had the invalidation committed a moment after a read from the
table; its attempt is fenced at completion either way. This is why only the
worker's input resolution uses the cache (``SqlStore.resolve_recent_outputs``)
and ``resolve_outputs`` always reads the table.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence

_Entry = tuple[tuple[str, str], tuple[str, str]]  # (run ID, output ID), (fields, data)

__all__ = ["ENTRY_BYTES", "MAX_BYTES", "MAX_OUTPUT_BYTES", "RecentOutputs"]

MAX_BYTES = 8 * 1024 * 1024
"""Memory one store's cache takes at most, in bytes (estimated: the texts'
characters plus :data:`ENTRY_BYTES` per output)."""

MAX_OUTPUT_BYTES = 64 * 1024
"""A larger output is not kept (reading it again costs little next to it)."""

ENTRY_BYTES = 320
"""What an output costs beyond its texts' characters (the Python objects of
its key, its entry and its strings, measured with ``tracemalloc``)."""


class RecentOutputs:
    """Stored ``(fields, data)`` texts by run and output ID; thread-safe."""

    __slots__ = ("_entries", "_lock", "_size", "max_bytes", "max_output_bytes")

    def __init__(
        self, max_bytes: int = MAX_BYTES, max_output_bytes: int = MAX_OUTPUT_BYTES
    ) -> None:
        self.max_bytes = max_bytes
        self.max_output_bytes = min(max_output_bytes, max_bytes)
        self._entries: dict[tuple[str, str], tuple[str, str]] = {}
        self._size = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes held now (estimated as :data:`MAX_BYTES` says)."""
        return self._size

    def keepable(self, rows: Sequence[Mapping[str, object]]) -> list[_Entry]:
        """The entries of output rows (``run_id``, ``output_id``, ``fields``
        and ``data`` as the store wrote them) that :meth:`add` would keep:
        the newest that fit the budget. A writer takes them before its
        commit, so that a huge batch's rows need not live until then."""
        found: list[_Entry] = []
        room = self.max_bytes
        for row in reversed(rows):
            fields, data = row.get("fields"), row.get("data")
            run_id, output_id = row.get("run_id"), row.get("output_id")
            if not (
                isinstance(fields, str)
                and isinstance(data, str)
                and isinstance(run_id, str)
                and isinstance(output_id, str)
            ):
                continue
            entry = ((run_id, output_id), (fields, data))
            cost = _cost(*entry)
            if cost > self.max_output_bytes:
                continue
            if cost > room:
                break
            room -= cost
            found.append(entry)
        found.reverse()
        return found

    def add(self, entries: Iterable[_Entry]) -> None:
        """Keep committed outputs (entries from :meth:`keepable`), forgetting
        the oldest beyond the budget."""
        with self._lock:
            held = self._entries
            for key, texts in entries:
                old = held.pop(key, None)
                if old is not None:
                    self._size -= _cost(key, old)
                held[key] = texts
                self._size += _cost(key, texts)
            while self._size > self.max_bytes:
                key = next(iter(held))
                self._size -= _cost(key, held.pop(key))

    def get(self, run_id: str, output_ids: Sequence[str]) -> dict[str, tuple[str, str]] | None:
        """The texts of every one of ``output_ids``, or ``None`` unless all
        are held."""
        found: dict[str, tuple[str, str]] = {}
        with self._lock:
            entries = self._entries
            for output_id in output_ids:
                texts = entries.get((run_id, output_id))
                if texts is None:
                    return None
                found[output_id] = texts
        return found


def _cost(key: tuple[str, str], texts: tuple[str, str]) -> int:
    return len(texts[0]) + len(texts[1]) + len(key[1]) + ENTRY_BYTES
