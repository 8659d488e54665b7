"""Integers in headers and query strings: plain non-negative decimals, one value per name.

HTTP gives strings; `int()` would accept signs, underscores, spaces and other digit
scripts, so every route that reads a number from a header or the query goes through here."""

from __future__ import annotations

import re

from loomrt.errors import InvalidRequest

DECIMAL = re.compile(r"0|[1-9][0-9]{0,17}")   # whole string: fullmatch


def is_decimal(text: str) -> bool:
    return DECIMAL.fullmatch(text) is not None


def one_decimal(values: list[str], what: str, lo: int = 0, hi: int = 2**62, param: str | None = None) -> int:
    """The single decimal integer in `values` (all the header's or query key's values), in lo..hi."""
    if len(values) != 1 or not is_decimal(values[0]) or not lo <= int(values[0]) <= hi:
        raise InvalidRequest(f"{what} must be one integer in {lo}..{hi}, got {', '.join(values)!r}",
                             param=param)
    return int(values[0])


__all__ = ["DECIMAL", "is_decimal", "one_decimal"]
