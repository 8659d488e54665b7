"""Strict JSON: the one decoder for model documents, control-code `json_decode` and (later) request bodies.

`json.loads` silently keeps the last of duplicate keys and accepts NaN/Infinity; a
serving contract must reject both, and numbers that do not fit what reads them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


class StrictJsonError(ValueError):
    """Text that is not strict JSON; `lineno`/`colno` when the position is known."""

    def __init__(self, message: str, lineno: int | None = None, colno: int | None = None):
        super().__init__(message)
        self.lineno, self.colno = lineno, colno


def loads(text: str | bytes, int_limit: int | None = None) -> Any:
    """Decode strict JSON: no duplicate keys, no NaN/Infinity, no float overflow, no lone
    surrogates, and integers with |x| < int_limit when one is given."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise StrictJsonError(f"duplicate key {k!r}")
            out[k] = v
        return out

    def constant(name: str) -> Any:
        raise StrictJsonError(f"{name} is not JSON")

    def parse_float(raw: str) -> float:
        v = float(raw)
        if math.isinf(v):
            raise StrictJsonError(f"{raw} is out of range")
        return v

    def parse_int(raw: str) -> int:
        v = int(raw)
        if int_limit is not None and not -int_limit < v < int_limit:
            raise StrictJsonError(f"{raw[:20]}... is out of range")
        return v

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant,
                           parse_float=parse_float, parse_int=parse_int)
    except json.JSONDecodeError as exc:
        raise StrictJsonError(exc.msg, exc.lineno, exc.colno) from None
    except RecursionError:
        raise StrictJsonError("nested too deeply") from None
    except StrictJsonError:
        raise
    except ValueError as exc:  # int() refusing thousands of digits
        raise StrictJsonError(str(exc)) from None
    source = text if isinstance(text, str) else text.decode("utf-8", "replace")
    if _SURROGATE_ESCAPE.search(source) and _has_lone_surrogate(value):
        raise StrictJsonError("a string holds a lone UTF-16 surrogate")
    return value


def _has_lone_surrogate(v: Any) -> bool:
    """Iterative: `json.loads` accepts nesting deeper than a recursive walk could follow."""
    stack = [v]
    while stack:
        v = stack.pop()
        if type(v) is str:
            if any("\ud800" <= c <= "\udfff" for c in v):
                return True
        elif type(v) is list:
            stack.extend(v)
        elif type(v) is dict:
            stack.extend(v)
            stack.extend(v.values())
    return False
