"""Truncation policies for over-long token sequences.

* ``error`` — raise a `FormatError` that states the length and the limit (the caller
  re-raises it as a `DataError` naming file and row);
* ``left``  — keep the last `limit` tokens (drop the beginning);
* ``right`` — keep the first `limit` tokens (drop the end).
"""

from __future__ import annotations

from typing import Sequence, TypeVar

from rljax.data.errors import FormatError

TRUNCATION_POLICIES: tuple[str, ...] = ("error", "left", "right")

T = TypeVar("T")


def check_policy(policy: str) -> None:
    if policy not in TRUNCATION_POLICIES:
        raise ValueError(f"truncation must be one of {TRUNCATION_POLICIES}, got {policy!r}")


def truncation_slice(length: int, limit: int, policy: str, what: str = "sequence") -> slice:
    """The slice that keeps at most `limit` of `length` items under `policy`."""
    check_policy(policy)
    if length <= limit:
        return slice(0, length)
    if policy == "error":
        raise FormatError(
            f"{what} has {length} tokens, more than the limit of {limit} "
            "(set truncation to 'left' or 'right', or raise the limit)"
        )
    if policy == "left":
        return slice(length - limit, length)
    return slice(0, limit)


def truncate(tokens: Sequence[T], limit: int, policy: str, what: str = "sequence") -> list[T]:
    """`tokens` cut to `limit` items by `policy` (see the module docstring)."""
    return list(tokens[truncation_slice(len(tokens), limit, policy, what)])
