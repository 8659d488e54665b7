"""The one JSON-validation helper: strict decoding and typed field access with the field named.

Every message starts with the field's path and sets `param` to it, so a client sees
`limits.max_output_tokens: expected integer, got "4096"` whether the object was a model
document (`loomrt.document`) or a control request body (`loomd`).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Mapping
from typing import Any

from loomc import strict_json
from loomrt.errors import InvalidRequest

INT_LIMIT = 2**63  # larger integers fail in the decoder, before any field sees them
U64_LIMIT = 2**64  # inference request bodies: any u64 (a sampling seed) reaches the policy


def shown(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return json.dumps(value)


def fail(path: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {message}", param=path)


def reject_unknown(keys: Mapping[str, Any], known: tuple[str, ...], prefix: str = "") -> None:
    for key in keys:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean '{prefix}{near[0]}'?)" if near else ""
            raise InvalidRequest(f"unknown field '{prefix}{key}'{hint}", param=prefix + key)


def expect_object(path: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail(path, f"expected object, got {shown(value)}")
    return value


def expect_string(path: str, value: Any) -> str:
    if not isinstance(value, str):
        raise fail(path, f"expected string, got {shown(value)}")
    return value


def expect_integer(path: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(path, f"expected integer, got {shown(value)}")
    if not lo <= value <= hi:
        raise fail(path, f"{value} is out of range {lo}..{hi}")
    return value


def expect_name(path: str, value: Any, what: str) -> str:
    text = expect_string(path, value)
    if not 1 <= len(text) <= 64 or not all("!" <= c <= "~" for c in text):
        raise fail(path, f"{what} must be 1-64 visible ASCII characters, got {shown(text)}")
    return text


def decode_object(text_or_bytes: str | bytes, what: str = "request body", int_limit: int = INT_LIMIT
                  ) -> dict[str, Any]:
    """A strict JSON object (`loomc.strict_json`); a duplicate key is named by its dotted path.
    Integers must stay below `int_limit` in magnitude (documents: 2^63; inference bodies
    allow the full u64 range, e.g. a seed, and leave the policy to judge them)."""
    if isinstance(text_or_bytes, (bytes, bytearray)):
        try:
            text = bytes(text_or_bytes).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest(f"{what} is not UTF-8 (byte {exc.start})") from None
    else:
        text = text_or_bytes
    try:
        doc = strict_json.loads(text, int_limit=int_limit)
    except strict_json.StrictJsonError as exc:
        dup = first_duplicate(text) if str(exc).startswith("duplicate key") else None
        if dup is not None:
            raise InvalidRequest(f"duplicate field '{dup}'", param=dup) from None
        big = first_out_of_range(text, int_limit) if "out of range" in str(exc) or "digits" in str(exc) else None
        if big is not None:
            path, raw = big
            shown_raw = raw if len(raw) <= 40 else f"{raw[:20]}...({len(raw)} digits)"
            raise InvalidRequest(f"{path}: {shown_raw} is out of range: integers here must lie in "
                                 f"{1 - int_limit}..{int_limit - 1}", param=path) from None
        where = f" at line {exc.lineno} column {exc.colno}" if exc.lineno is not None else ""
        raise InvalidRequest(f"{what} is not valid JSON{where}: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest(f"the {what} must be a JSON object, got {shown(doc)}")
    return doc


class _Pairs(list):
    pass


class _Big(str):
    """An integer literal beyond the decoder's limit, kept as its text (never converted:
    Python refuses to convert thousands of digits)."""


def _first_path(node: Any, found: Callable[[Any, str], Any], prefix: str = "") -> Any:
    """Walk a `_Pairs` tree depth-first; the first non-None `found(node, prefix)`, where
    `prefix` is the node's dotted path plus a trailing dot (`messages[1].`)."""
    hit = found(node, prefix)
    if hit is not None:
        return hit
    if isinstance(node, _Pairs):
        for k, v in node:
            hit = _first_path(v, found, f"{prefix}{k}.")
            if hit is not None:
                return hit
    elif isinstance(node, list):
        for i, v in enumerate(node):
            hit = _first_path(v, found, f"{prefix[:-1] if prefix else ''}[{i}].")
            if hit is not None:
                return hit
    return None


def first_duplicate(text: str) -> str | None:
    """The dotted path of the first duplicated key. Only called after `strict_json` has
    rejected the text, to name the path: its hook sees objects bottom-up, without one."""

    def duplicate(node: Any, prefix: str) -> str | None:
        if isinstance(node, _Pairs):
            seen: set[str] = set()
            for k, _ in node:
                if k in seen:
                    return prefix + k
                seen.add(k)
        return None

    try:
        return _first_path(json.loads(text, object_pairs_hook=_Pairs), duplicate)
    except (ValueError, RecursionError):
        return None


def first_out_of_range(text: str, int_limit: int) -> tuple[str, str] | None:
    """(dotted path, literal) of the first integer with |x| >= `int_limit`, so the error names
    the field (`seed`) instead of calling the whole body invalid JSON. Only called after
    `strict_json` rejected the text; None at the top level or when the text is no JSON."""
    digits = len(str(int_limit))

    def parse_int(raw: str) -> Any:
        if len(raw.lstrip("-")) > digits or not -int_limit < int(raw) < int_limit:
            return _Big(raw)
        return 0

    def big(node: Any, prefix: str) -> tuple[str, str] | None:
        return (prefix[:-1], str(node)) if isinstance(node, _Big) and prefix else None

    try:
        return _first_path(json.loads(text, object_pairs_hook=_Pairs, parse_int=parse_int), big)
    except (ValueError, RecursionError):
        return None


def expect_seed(body: Mapping[str, Any], key: str = "seed") -> int:
    """An optional seed: an unsigned 64-bit integer or its decimal string (the spec's form for
    speech and image seeds, which JSON numbers cannot always carry exactly); 0 when absent."""
    value = body.get(key)
    if value is None:
        return 0
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < U64_LIMIT:
        raise fail(key, f"expected an unsigned 64-bit integer or its decimal string, got {shown(value)}")
    return value


def fields_of(obj: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """`obj` when it has every required field and no unknown one."""
    reject_unknown(obj, required + optional)
    for key in required:
        if key not in obj:
            raise InvalidRequest(f"{key}: required field is missing", param=key)
    return obj


__all__ = ["INT_LIMIT", "U64_LIMIT", "decode_object", "expect_integer", "expect_name", "expect_seed", "expect_object", "expect_string",
           "fail", "fields_of", "first_duplicate", "first_out_of_range", "reject_unknown", "shown"]
