"""Reading, with a batch of completions, what the reconcile after it reads.

After a worker's completions commit, the reconcile of each run reads the
run's frontier around the completed nodes (:mod:`dagwerk.frontier`) and the
planning snapshot of each child it launches: on PostgreSQL two read
transactions per step of a chain, each a round trip. A
:class:`CompletionReadsStore` makes those reads in the completions' own
transaction, after their writes and under the run lock they hold, in the
flight of its ``COMMIT``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

__all__ = ["CompletionReadsStore"]


@runtime_checkable
class CompletionReadsStore(Protocol):
    """Completions that read ahead for their reconcile (dagwerk extension;
    PostgreSQL). Without it the reconcile reads in transactions of its own."""

    def reads_with_completions(self) -> AbstractContextManager[None]:
        """A block on the calling thread. Inside it, a ``complete_and_ack``
        that completes launches of one run (whose topology the store has
        cached) also reads, before it commits, that run's frontier around the
        completed nodes and the outputs of each completed node that is a
        parent of a child whose every parent it completed. The block's next
        ``get_run_frontier`` of the run and the next ``get_planning_snapshot``
        of each such child answer from those reads, once each, when they cover
        the call; every other call reads as usual.

        The answers are as of that commit. Completions of one run commit one
        after another under its lock, so the last of them reads every other:
        a child made ready by several completions is seen ready by the last.
        A snapshot that went stale meanwhile is refused by the launch (its
        token), which then reads a new one."""
        ...
