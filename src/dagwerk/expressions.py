"""Parsing, validation and evaluation of binding expressions.

An expression is literal text with ``{…}`` segments. A segment is a reference
``namespace.key`` or the function call ``list(ref, …)``, optionally followed
by a pipe chain: ``{records.title | trim | truncate(40)}``. The namespace
``input`` reads run input; every other namespace is an edge name.

A lone segment keeps the JSON type of its value; anything else interpolates
to a string. Every intermediate value is plain JSON (``dict``/``list``), at
most ``max_result_bytes`` in canonical form, and charged to the launch's
:class:`EvaluationBudget` when one is given. Parsing is bounded (16,384
characters, 64 reference and pipe evaluations, 4,096-character pipe
arguments) and done before any lookup.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from dagwerk.constants import (
    MAX_EXPRESSION_EVALUATION_STEPS,
    MAX_EXPRESSION_LENGTH,
    MAX_EXPRESSION_RESULT_BYTES,
    MAX_PIPE_ARGUMENT_LENGTH,
)
from dagwerk.errors import ExpressionError
from dagwerk.json import JsonWireValue, bounded_json_size, freeze_json, thaw_json
from dagwerk.pipes import (
    BUILTIN_PIPES,
    PIPE_ARITY,
    bounded_text_join,
    result_byte_limit,
    warn_regex_fallback,
)

__all__ = [
    "EvaluationBudget",
    "ExpressionError",
    "ExpressionVocabulary",
    "Lookup",
    "PipeCall",
    "PipeSpec",
    "Token",
    "expression_evaluation_steps",
    "extract_refs",
    "get_expression_vocabulary",
    "resolve_expression",
    "tokenize_expression",
    "validate_expression",
]


@dataclass(frozen=True, slots=True)
class PipeCall:
    """One pipe of a chain: its name and its string arguments."""

    name: str
    args: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PipeSpec:
    """A pipe's arity; ``argument_names`` are the arguments after the piped value."""

    name: str
    min_args: int
    max_args: int
    argument_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ExpressionVocabulary:
    """Every pipe in registry order and every function name."""

    pipes: tuple[PipeSpec, ...]
    functions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Token:
    """A parsed piece: literal ``text``, a ``ref`` or a function ``call``.

    ``value`` is the text, the reference or the function name; ``refs`` are a
    call's argument references.
    """

    kind: Literal["text", "ref", "call"]
    value: str
    pipes: tuple[PipeCall, ...]
    refs: tuple[str, ...] = ()


Lookup: TypeAlias = Callable[[str, str], object | None]


@dataclass(slots=True)
class EvaluationBudget:
    """Canonical JSON bytes that one node launch may still evaluate.

    Every charge that would take ``used`` past ``limit`` raises
    :class:`ExpressionError` and leaves ``used`` unchanged.
    """

    limit: int
    used: int = 0

    def __post_init__(self) -> None:
        if type(self.limit) is not int or self.limit < 0:
            raise ValueError("evaluation byte limit must be a non-negative int")
        if type(self.used) is not int or not 0 <= self.used <= self.limit:
            raise ValueError("used evaluation bytes must be an int within the limit")

    def charge_size(self, size: int) -> None:
        """Record ``size`` more bytes."""
        if type(size) is not int or size < 0:
            raise ValueError("evaluation size must be a non-negative int")
        if size > self.limit - self.used:
            raise ExpressionError(
                f"binding evaluation exceeds the {self.limit}-byte launch limit",
                code="binding_budget_exhausted",
                limit=self.limit,
            )
        self.used += size

    def charge(self, value: object) -> None:
        """Record the canonical size of ``value``."""
        remaining = self.limit - self.used
        try:
            size = bounded_json_size(value, remaining)
        except ValueError as exc:
            raise ExpressionError(f"value is not JSON-compatible: {exc}") from exc
        self.charge_size(size)


_FUNCTION_START: Final = re.compile(r"[A-Za-z_]\w*\(")
_FUNCTIONS: Final = ("list",)


# --- parsing -----------------------------------------------------------------


def _limit_error(message: str, limit: int) -> ExpressionError:
    return ExpressionError(message, code="expression_too_large", limit=limit)


@functools.lru_cache(maxsize=512)
def tokenize_expression(expression: str) -> tuple[Token, ...]:
    """Parse ``expression`` into immutable tokens (cached).

    Raises :class:`ExpressionError` for text over 16,384 characters, bad
    braces, references or calls, empty pipes, over-long pipe arguments and
    more than 64 reference and pipe evaluations.
    """
    if not isinstance(expression, str):
        raise ExpressionError("expression must be a string")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise _limit_error(
            f"expression is {len(expression)} characters; maximum is {MAX_EXPRESSION_LENGTH}",
            MAX_EXPRESSION_LENGTH,
        )
    tokens: list[Token] = []
    text: list[str] = []
    pos = 0
    end = len(expression)
    while pos < end:
        char = expression[pos]
        if char == "\\" and pos + 1 < end and expression[pos + 1] in "{}":
            text.append(expression[pos + 1])
            pos += 2
        elif char == "}":
            raise ExpressionError(f"Unexpected '}}' at position {pos}")
        elif char == "{":
            close = expression.find("}", pos + 1)
            nested = expression.find("{", pos + 1)
            if nested != -1 and (close == -1 or nested < close):
                raise ExpressionError(f"nested braces are not supported at position {nested}")
            if close == -1:
                raise ExpressionError(f"Unclosed '{{' at position {pos}")
            if text:
                tokens.append(Token("text", "".join(text), ()))
                text.clear()
            tokens.append(_parse_segment(expression[pos + 1 : close].strip(), pos))
            pos = close + 1
        else:
            # Copy the run of ordinary characters in one step.
            stop = pos + 1
            while stop < end and expression[stop] not in "{}\\":
                stop += 1
            text.append(expression[pos:stop])
            pos = stop
    if text:
        tokens.append(Token("text", "".join(text), ()))
    result = tuple(tokens)
    steps = _steps(result)
    if steps > MAX_EXPRESSION_EVALUATION_STEPS:
        raise _limit_error(
            f"expression requires {steps} reference and pipe evaluations; "
            f"maximum is {MAX_EXPRESSION_EVALUATION_STEPS}",
            MAX_EXPRESSION_EVALUATION_STEPS,
        )
    return result


def _steps(tokens: tuple[Token, ...]) -> int:
    return sum(
        len(token.pipes) + (1 if token.kind == "ref" else len(token.refs)) for token in tokens
    )


def expression_evaluation_steps(expression: str) -> int:
    """The number of reference lookups, ``list`` arguments and pipe calls."""
    return _steps(tokenize_expression(expression))


def _parse_segment(body: str, pos: int) -> Token:
    if not body:
        raise ExpressionError(f"Empty reference '{{}}' at position {pos}")
    if _FUNCTION_START.match(body):
        return _parse_call(body, pos)
    parts = _split_pipes(body, pos)
    ref = parts[0]
    if not ref:
        raise ExpressionError(f"Empty reference at position {pos}")
    _check_ref(ref, pos)
    return Token("ref", ref, _parse_chain(parts[1:], pos))


def _split_pipes(body: str, pos: int) -> list[str]:
    """Split on ``|`` outside parentheses; each part is stripped."""
    parts: list[str] = []
    start = 0
    depth = 0
    for index, char in enumerate(body):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise ExpressionError(f"Unbalanced closing paren at position {pos}")
        elif char == "|" and depth == 0:
            parts.append(body[start:index].strip())
            start = index + 1
    parts.append(body[start:].strip())
    return parts


def _parse_chain(raw_pipes: list[str], pos: int) -> tuple[PipeCall, ...]:
    calls: list[PipeCall] = []
    for raw in raw_pipes:
        if not raw:
            raise ExpressionError(f"Empty pipe in chain at position {pos}")
        calls.append(_parse_pipe(raw, pos))
    return tuple(calls)


def _parse_pipe(raw: str, pos: int) -> PipeCall:
    paren = raw.find("(")
    if paren == -1:
        return PipeCall(raw, ())
    name = raw[:paren].strip()
    if not raw.endswith(")"):
        raise ExpressionError(f"Unclosed '(' in pipe '{name}' at position {pos}")
    args = _split_arguments(raw[paren + 1 : -1])
    for arg in args:
        if len(arg) > MAX_PIPE_ARGUMENT_LENGTH:
            raise _limit_error(
                f"pipe '{name}' argument is {len(arg)} characters; "
                f"maximum is {MAX_PIPE_ARGUMENT_LENGTH}",
                MAX_PIPE_ARGUMENT_LENGTH,
            )
    return PipeCall(name, args)


def _split_arguments(text: str) -> tuple[str, ...]:
    """Comma-separated, trimmed arguments; ``\\,`` is a literal comma.

    Only a trailing empty argument is dropped, so ``f()`` has none while
    ``f(a,,b)`` keeps the empty middle one.
    """
    args: list[str] = []
    current: list[str] = []
    index = 0
    end = len(text)
    while index < end:
        char = text[index]
        if char == "\\" and index + 1 < end and text[index + 1] == ",":
            current.append(",")
            index += 2
            continue
        if char == ",":
            args.append("".join(current).strip())
            current.clear()
        else:
            current.append(char)
        index += 1
    last = "".join(current).strip()
    if last:
        args.append(last)
    return tuple(args)


def _parse_call(body: str, pos: int) -> Token:
    open_paren = body.index("(")
    name = body[:open_paren].strip()
    depth = 0
    close = -1
    for index in range(open_paren, len(body)):
        if body[index] == "(":
            depth += 1
        elif body[index] == ")":
            depth -= 1
            if depth == 0:
                close = index
                break
    if close == -1:
        raise ExpressionError(f"Unclosed '(' in function '{name}' at position {pos}")
    refs = tuple(arg.strip() for arg in body[open_paren + 1 : close].split(",") if arg.strip())
    if len(refs) > MAX_EXPRESSION_EVALUATION_STEPS:
        raise _limit_error(
            f"function '{name}' has {len(refs)} references; "
            f"maximum is {MAX_EXPRESSION_EVALUATION_STEPS}",
            MAX_EXPRESSION_EVALUATION_STEPS,
        )
    for ref in refs:
        if "(" in ref or ")" in ref:
            raise ExpressionError(f"Nested function calls are not supported at position {pos}")
        _check_ref(ref, pos)
    rest = body[close + 1 :].strip()
    pipes: tuple[PipeCall, ...] = ()
    if rest:
        if not rest.startswith("|"):
            raise ExpressionError(
                f"Expected '|' after function call at position {pos}, got '{rest[0]}'"
            )
        pipes = _parse_chain(_split_pipes(rest[1:], pos), pos)
    if name not in _FUNCTIONS:
        raise ExpressionError(f"Unknown function '{name}'")
    return Token("call", name, pipes, refs)


def _check_ref(ref: str, pos: int) -> None:
    dot = ref.find(".")
    if dot == -1:
        problem = "expected 'namespace.key'"
    elif dot == 0:
        problem = "namespace cannot be empty"
    elif dot == len(ref) - 1:
        problem = "key cannot be empty"
    else:
        return
    raise ExpressionError(f"Invalid reference '{ref}' at position {pos}: {problem}")


def _split_ref(ref: str) -> tuple[str, str]:
    # Tokens only hold references that passed ``_check_ref``.
    namespace, _, key = ref.partition(".")
    return namespace, key


# --- static checks -----------------------------------------------------------


def get_expression_vocabulary() -> ExpressionVocabulary:
    """Every built-in pipe in registry order, with arity and argument names."""
    specs: list[PipeSpec] = []
    for name, pipe in BUILTIN_PIPES.items():
        low, high = PIPE_ARITY[name]
        names = tuple(inspect.signature(pipe).parameters)[1:]
        specs.append(PipeSpec(name, low, high, names))
    return ExpressionVocabulary(tuple(specs), _FUNCTIONS)


def _arity_problem(call: PipeCall) -> str | None:
    if call.name not in BUILTIN_PIPES:
        return f"Unknown pipe '{call.name}'"
    arity = PIPE_ARITY.get(call.name)
    if arity is None:
        return None
    low, high = arity
    count = len(call.args)
    if low <= count <= high:
        return None
    expected = str(low) if low == high else f"{low}-{high}"
    return f"Pipe '{call.name}' expects {expected} arg(s), got {count}"


def validate_expression(expression: str) -> str | None:
    """``None`` if ``expression`` is valid, else the first problem found.

    Checks syntax and limits, pipe names and pipe arity without evaluating.
    A ``match`` pipe warns once per process if google-re2 is missing
    (:func:`dagwerk.pipes.warn_regex_fallback`).
    """
    try:
        tokens = tokenize_expression(expression)
    except ExpressionError as exc:
        return str(exc)
    for token in tokens:
        for call in token.pipes:
            problem = _arity_problem(call)
            if problem is not None:
                return problem
            if call.name == "match":
                warn_regex_fallback()
    return None


def extract_refs(expression: str) -> tuple[set[str], set[str]]:
    """The edge namespaces and the ``input`` keys the expression reads.

    References inside ``list(...)`` count; invalid syntax raises
    :class:`ExpressionError`.
    """
    edges: set[str] = set()
    inputs: set[str] = set()
    for token in tokenize_expression(expression):
        refs = (token.value,) if token.kind == "ref" else token.refs
        for ref in refs:
            namespace, key = _split_ref(ref)
            if namespace == "input":
                inputs.add(key)
            else:
                edges.add(namespace)
    return edges, inputs


# --- evaluation --------------------------------------------------------------


class _Evaluation:
    """State of one ``resolve_expression`` call: lookup, budget, size limit."""

    __slots__ = ("budget", "limit", "lookup")

    def __init__(self, lookup: Lookup, budget: EvaluationBudget | None, limit: int) -> None:
        self.lookup = lookup
        self.budget = budget
        self.limit = limit

    def admit(self, value: object, what: str) -> tuple[JsonWireValue, int]:
        """Copy ``value`` as plain JSON, check its size and charge the budget."""
        try:
            plain = thaw_json(freeze_json(value))
        except (ValueError, RecursionError) as exc:
            raise ExpressionError(f"{what} is not JSON-compatible: {exc}") from exc
        size = self.size(plain)
        if size > _RENDERABLE_INT_BYTES:
            _check_renderable(plain, what)
        if size > self.limit:
            raise _limit_error(
                f"{what} is more than {self.limit} bytes; maximum is {self.limit}", self.limit
            )
        if self.budget is not None:
            self.budget.charge_size(size)
        return plain, size

    def size(self, value: object) -> int:
        try:
            return bounded_json_size(value, self.limit)
        except ValueError as exc:
            raise ExpressionError(f"expression value is not valid JSON: {exc}") from exc

    def reference(self, ref: str) -> tuple[JsonWireValue, int]:
        namespace, key = _split_ref(ref)
        return self.admit(self.lookup(namespace, key), f"reference '{ref}'")

    def call(self, token: Token) -> JsonWireValue:
        if token.value != "list":
            raise ExpressionError(f"Unknown function '{token.value}'")
        items: list[JsonWireValue] = []
        size = 2  # the brackets
        for ref in token.refs:
            item, item_size = self.reference(ref)
            # Grow the array only while it fits, so no lookup happens after
            # the result limit is crossed.
            size += item_size + (1 if items else 0)
            if size > self.limit:
                raise _limit_error(
                    f"list() result is more than {self.limit} bytes; maximum is {self.limit}",
                    self.limit,
                )
            items.append(item)
        return self.admit(items, "list() result")[0]

    def pipes(self, value: JsonWireValue, calls: tuple[PipeCall, ...]) -> JsonWireValue:
        for call in calls:
            pipe = BUILTIN_PIPES.get(call.name)
            if pipe is None:
                raise ExpressionError(f"Unknown pipe '{call.name}'")
            problem = _arity_problem(call)
            if problem is not None:
                raise ExpressionError(problem)
            if value is None:
                # A missing value reaches pipes as "", so default() can apply.
                value = ""
            try:
                result = pipe(value, *call.args)
            except ExpressionError:
                raise
            except (TypeError, ValueError, ArithmeticError, RecursionError) as exc:
                raise ExpressionError(f"pipe '{call.name}' failed: {exc}") from exc
            value = self.admit(result, f"result of pipe '{call.name}'")[0]
        return value

    def segment(self, token: Token) -> JsonWireValue:
        if token.kind == "ref":
            value = self.reference(token.value)[0]
        else:
            value = self.call(token)
        return self.pipes(value, token.pipes) if token.pipes else value

    def interpolate(self, tokens: tuple[Token, ...]) -> str:
        return bounded_text_join(self._rendered(tokens))

    def _rendered(self, tokens: tuple[Token, ...]) -> Iterator[str]:
        # A generator, so the join's size check stops lookups at the limit.
        for token in tokens:
            yield token.value if token.kind == "text" else _render(self.segment(token))


# Below this many bytes no integer can pass the interpreter's int-to-text
# limit (4,300 digits by default, 640 at the least).
_RENDERABLE_INT_BYTES: Final = 640


def _check_renderable(value: JsonWireValue, what: str) -> None:
    """Refuse integers too long for ``str()``: pipes and interpolation need their text."""
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif type(item) is int and item.bit_length() > 2 * _RENDERABLE_INT_BYTES:
            try:
                int.__repr__(item)
            except ValueError as exc:
                raise ExpressionError(
                    f"{what} holds an integer too long to render as text: {exc}",
                    code="expression_invalid_text",
                ) from exc


def _render(value: JsonWireValue) -> str:
    """Text of a value inside interpolation: arrays join non-null items with ", "."""
    if value is None:
        return ""
    if isinstance(value, list):
        return bounded_text_join((str(item) for item in value if item is not None), ", ")
    return str(value)


def resolve_expression(
    expression: str,
    lookup: Lookup,
    *,
    budget: EvaluationBudget | None = None,
    max_result_bytes: int = MAX_EXPRESSION_RESULT_BYTES,
) -> JsonWireValue:
    """Evaluate ``expression``, reading references through ``lookup``.

    A lone reference or call returns its JSON value (after its pipes); a lone
    missing reference without pipes is ``None``. Otherwise the segments are
    rendered into the text (missing values as ``""``) and the string is
    returned, or ``None`` if it is empty. Every reference, function result,
    pipe result and interpolated string is at most ``max_result_bytes`` and
    is charged to ``budget``; the first violation raises
    :class:`ExpressionError`. Exceptions raised by ``lookup`` itself
    propagate unchanged.
    """
    if type(max_result_bytes) is not int or max_result_bytes < 0:
        raise ValueError("max_result_bytes must be a non-negative int")
    tokens = tokenize_expression(expression)
    if not tokens:
        return None
    evaluation = _Evaluation(lookup, budget, max_result_bytes)
    with result_byte_limit(max_result_bytes):
        if len(tokens) == 1 and tokens[0].kind != "text":
            return evaluation.segment(tokens[0])
        text = evaluation.interpolate(tokens)
    if budget is not None:
        budget.charge_size(evaluation.size(text))
    return text or None
