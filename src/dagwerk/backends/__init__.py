"""Store backends. :class:`~dagwerk.backends.memory.MemoryStore` is the reference."""

from __future__ import annotations

from dagwerk.backends.memory import MemoryStore

__all__ = ["MemoryStore"]
