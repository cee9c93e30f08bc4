"""One transaction for a run's completions and the reconciles they cause.

On PostgreSQL a worker's completions commit in one transaction, which holds
the run in completion mode (claims of the run's other tasks go on beside
it), and the launch of each child they made ready in another, which holds
the run exclusively: two durable commits per step of a chain, since a
transaction must not strengthen its run lock (``queries.sql``, Locking). A
:class:`RunUnitStore` runs both in one transaction that holds the run
exclusively from its first statement, for a worker that expects its
completion to end its task's launch.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

__all__ = ["RunUnitStore"]


@runtime_checkable
class RunUnitStore(Protocol):
    """Store calls of one run in one exclusive transaction (dagwerk
    extension; PostgreSQL). Without it each call commits on its own."""

    def run_unit(self) -> AbstractContextManager[None]:
        """A block on the calling thread. Every store call the thread makes
        inside it joins one write transaction that commits when the block
        ends; reads see the block's earlier writes, and nothing of it is
        visible to others before it commits. The first call that locks a run
        holds that run exclusively until then: the run's claims and
        completions on other connections wait for the block, so a block is
        for the calls of one run (the completions of its tasks and the
        reconciles they cause), made without waiting on anything outside.

        All or nothing: a call that raises dooms the block, every later call
        raises, and the block rolls everything back at its end, raising
        :class:`~dagwerk.store.StoreContractError` (or
        :class:`~dagwerk.backends.errors.StoreUnavailableError` if the
        server was lost) even if the caller swallowed the first error.
        Callers must not act on a call's result outside the store before
        the block has committed. An inner block joins the outer one."""
        ...
