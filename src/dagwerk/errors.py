"""The exception root and the typed errors of the pure core.

Every error a user can act on derives from :class:`DagwerkError` and carries
a stable ``code``. Errors that the seed API documents as ``ValueError`` or
``RuntimeError`` subclass those too, so seed-style ``except ValueError``
keeps working.
"""

from __future__ import annotations


class DagwerkError(Exception):
    """Root of every dagwerk error.

    ``code`` is stable and machine-readable; ``field`` and ``limit`` name the
    input at fault and the bound it crossed, where there is one.
    """

    code: str = "dagwerk_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        field: str | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.field = field
        self.limit = limit

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class JsonLimitError(DagwerkError, ValueError):
    """A JSON value is not routable: wrong type, non-finite, or over a limit."""

    code = "json_invalid"


class ExpressionError(DagwerkError, ValueError):
    """An expression cannot be parsed or evaluated."""

    code = "expression_invalid"


class GraphValidationError(DagwerkError, ValueError):
    """A pipeline definition is invalid.

    ``node`` is the slug (or ``"Node N"``) at fault, ``field`` the attribute,
    ``rule`` a stable rule name such as ``"unknown_source"`` or ``"cycle"``.
    """

    code = "graph_invalid"

    def __init__(
        self,
        message: str,
        *,
        node: str | None = None,
        field: str | None = None,
        rule: str = "invalid",
        limit: int | None = None,
        cycle: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, field=field, limit=limit)
        self.node = node
        self.rule = rule
        self.cycle = cycle


class PlanningError(DagwerkError, ValueError):
    """Node inputs cannot be planned from a snapshot."""

    code = "planning_failed"


class MaterializationError(DagwerkError, RuntimeError):
    """A worker could not resolve the outputs named by its plan."""

    code = "materialization_failed"
