"""Per-plugin retry policy: how many attempts, how long to back off, which errors retry."""

from __future__ import annotations

import random
from dataclasses import dataclass

from dagwerk.errors import DagwerkError
from dagwerk.models import RetryPolicySpec
from dagwerk.runtime.errors import NonRetryableError

__all__ = ["RetryPolicy", "RetryPolicyError"]


class RetryPolicyError(DagwerkError, ValueError):
    """A retry policy setting is out of range."""

    code = "retry_policy_invalid"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``max_attempts`` counts the first attempt (1 = never retry, the default).

    A failure retries when attempts remain, the error is an instance of a
    ``retry_on`` type and of no ``give_up_on`` type, and it is not a
    :class:`NonRetryableError`. The delay before attempt ``n + 1`` is
    ``min(backoff_max, backoff_base * 2 ** (n - 1))``; with ``jitter`` it is
    drawn uniformly from ``[0, that]`` ("full jitter").
    """

    max_attempts: int = 1
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    jitter: bool = True
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    give_up_on: tuple[type[BaseException], ...] = ()
    # Exception classes named in a stored node setting ("Name" or
    # "module.Name"); matched against the error's class hierarchy.
    retry_on_names: tuple[str, ...] = ()
    give_up_on_names: tuple[str, ...] = ()

    @classmethod
    def from_spec(cls, spec: RetryPolicySpec) -> RetryPolicy:
        """The runtime policy of a node's stored ``retry`` setting; an empty
        ``retry_on`` retries every exception."""
        return cls(
            max_attempts=spec.max_attempts,
            backoff_base=spec.backoff_base,
            backoff_max=spec.backoff_max,
            jitter=spec.jitter,
            retry_on_names=tuple(spec.retry_on),
            give_up_on_names=tuple(spec.give_up_on),
        )

    def __post_init__(self) -> None:
        if type(self.max_attempts) is not int or self.max_attempts < 1:
            raise RetryPolicyError("max_attempts must be an int >= 1", field="max_attempts")
        if not self.backoff_base >= 0:
            raise RetryPolicyError("backoff_base must be >= 0", field="backoff_base")
        if not self.backoff_max >= self.backoff_base:
            raise RetryPolicyError("backoff_max must be >= backoff_base", field="backoff_max")

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Whether a failure of attempt number ``attempt`` (1-based) gets another attempt."""
        if attempt >= self.max_attempts:
            return False
        if isinstance(error, NonRetryableError):
            return False
        if self.give_up_on and isinstance(error, self.give_up_on):
            return False
        if self.give_up_on_names and _named(error, self.give_up_on_names):
            return False
        if self.retry_on_names and not _named(error, self.retry_on_names):
            return False
        return isinstance(error, self.retry_on)

    def next_delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before the attempt after attempt number ``attempt``."""
        if attempt < 1:
            raise RetryPolicyError("attempt numbers start at 1", field="attempt")
        # The exponent is capped so huge attempt numbers cannot overflow a float.
        ceiling = min(self.backoff_max, self.backoff_base * 2.0 ** min(attempt - 1, 64))
        if not self.jitter:
            return ceiling
        return (rng or random).uniform(0.0, ceiling)


def _named(error: BaseException, names: tuple[str, ...]) -> bool:
    """Whether a class in the error's hierarchy has one of ``names`` (plain
    or module-qualified)."""
    wanted = set(names)
    for klass in type(error).__mro__:
        if klass.__name__ in wanted or f"{klass.__module__}.{klass.__qualname__}" in wanted:
            return True
    return False
