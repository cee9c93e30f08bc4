"""The in-memory reference store (thread-safe, one lock, no persistence)."""

from __future__ import annotations

from dagwerk.backends.memory.store import MemoryStore

__all__ = ["MemoryStore"]
