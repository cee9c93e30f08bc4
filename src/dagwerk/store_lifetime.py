"""A store's settings and lifetime (dagwerk extensions): the limits it
validates with, and the resources it holds until closed.

Re-exported by :mod:`dagwerk.store`; import the names from there.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from dagwerk.limits import Limits


@runtime_checkable
class LimitedStore(Protocol):
    """A store that validates with configurable limits (dagwerk extension).

    The orchestrator validates under the same limits; without it, under
    :data:`~dagwerk.limits.DEFAULT_LIMITS`.
    """

    limits: Limits
    """The byte and count limits the store validates runs, launches and
    completions with."""


@runtime_checkable
class ClosableStore(Protocol):
    """A store holding resources (connections, files) until closed (dagwerk
    extension)."""

    def close(self) -> None:
        """Release the store's resources; the store is unusable afterwards."""
        ...
