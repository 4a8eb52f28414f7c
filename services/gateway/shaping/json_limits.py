"""JSON that reaches the gateway outside inference (admin, repository and shared-memory bodies, config overrides,
the routing state it reads back): parsed by orjson, whose numbers stop at 64 bits and whose nesting stops at 1,024
levels, then held to ``MAX_DEPTH`` before anything walks, converts or quotes it (Python's ``repr`` of a list nested
1,000 levels deep raises ``RecursionError``, and so does protobuf's ``ParseDict`` of one)."""

from __future__ import annotations

from typing import Any

import orjson

from services.gateway.errors import InvalidInput, unparsed_json

MAX_DEPTH = 32
"""Levels of lists and objects: far more than any of these structures has (a ModelConfig nests 6, a routing
record 3), far less than what makes Python recurse too deep."""


def too_deep(value: object, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (dicts and lists, as a JSON parser builds them) nests more than ``limit`` levels; walked
    without recursion, stopping at the first level too many."""
    pending: list[tuple[object, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def bounded_json(raw: bytes | str) -> Any:
    """``raw`` parsed; ``ValueError`` (orjson's ``JSONDecodeError`` is one) for anything that is not plain JSON
    within ``MAX_DEPTH`` levels."""
    value = orjson.loads(raw)
    if too_deep(value):
        raise ValueError(f"it nests lists and objects more than {MAX_DEPTH} levels deep")
    return value


def client_json(raw: bytes | str, what: str) -> Any:
    """``raw`` parsed, or ``InvalidInput`` saying why not; ``what`` names it in the message ("the request body")."""
    try:
        return bounded_json(raw)
    except ValueError as exc:
        raise InvalidInput(unparsed_json(f"{what} is not valid JSON: {exc}")) from None
