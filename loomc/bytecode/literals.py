"""Names and literal texts from a `.loombc`, checked against the grammar's own tokens.

A constant is stored as its source text alone; its value is derived here exactly as
the parser derives it (the token regexes come from `loomc/grammar/loom.lark`, the escapes
from `AstBuilder`), so a text and a value can never disagree and every text `dis`
prints lexes back as the same single token.
"""

from __future__ import annotations

import functools
import re

from lark import Token, Tree

from loomc.bytecode.format import ConstKind
from loomc.syntax.build import AstBuilder
from loomc.syntax.parse import parser

_TOKEN_OF = {ConstKind.INT: "INT", ConstKind.FLOAT: "FLOAT", ConstKind.STR: "STRING", ConstKind.BYTES: "BYTES"}
_MAX_U64_DIGITS = 20  # len(str(2**64 - 1))


@functools.cache
def _patterns() -> dict[str, re.Pattern]:
    return {t.name: re.compile(t.pattern.to_regexp()) for t in parser().terminals
            if t.name in ("NAME", "INT", "FLOAT", "STRING", "BYTES")}


@functools.cache
def keywords() -> frozenset[str]:
    """The reserved words: string terminals that look like names."""
    name = _patterns()["NAME"]
    return frozenset(t.pattern.value for t in parser().terminals
                     if t.pattern.type == "str" and name.fullmatch(t.pattern.value))


def name_problem(text: str) -> str | None:
    """Why `text` cannot be a name in `.loom` source, or None if it can."""
    if not _patterns()["NAME"].fullmatch(text):
        return f"{text!r} is not a name"
    if text in keywords():
        return f"{text!r} is a reserved word, not a name"
    return None


def literal_value(kind: ConstKind, text: str) -> int | float | str | bytes:
    """The value the parser gives this literal text; ValueError says why there is none."""
    if not _patterns()[_TOKEN_OF[kind]].fullmatch(text):
        raise ValueError(f"{text[:40]!r} is not {kind.name.lower()} literal text")
    if kind is ConstKind.INT:
        return _int_value(text)
    if kind is ConstKind.FLOAT:
        return float(text.replace("_", ""))
    builder = AstBuilder("<loombc>")
    token = Token(_TOKEN_OF[kind], text, line=1, column=1)
    if kind is ConstKind.STR:
        value: str | bytes = builder.string_value(token)
    else:
        value = builder.expr_bytes_lit(Tree("bytes_lit", [token])).value
    if builder.diagnostics:
        raise ValueError(f"{text[:40]!r}: {builder.diagnostics[0].message}")
    return value


def _int_value(text: str) -> int:
    digits = text.replace("_", "")
    if digits[:2] in ("0x", "0b"):
        value = int(digits[2:], 16 if digits[1] == "x" else 2)  # power-of-two bases: no digit limit
    else:
        significant = digits.lstrip("0") or "0"
        if len(significant) > _MAX_U64_DIGITS:  # before int(): Python refuses > 4300 digits
            raise ValueError(f"integer literal {text[:40]} does not fit in 64 bits")
        value = int(significant)
    if value >= 2**64:
        raise ValueError(f"integer literal {text[:40]} does not fit in 64 bits")
    return value
