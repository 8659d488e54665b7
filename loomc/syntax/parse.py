"""The single parse entry: text → `ast.Module`, or one `LoomSyntaxError` with a positioned diagnostic.

One LALR parser per process (`cache=True` stores its tables). Comments are
collected through a lexer callback so the formatter can put them back.
"""

from __future__ import annotations

import functools
import threading
from importlib.resources import files

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from loomc.syntax import ast
from loomc.syntax.build import MAX_NESTING, AstBuilder, TooDeep
from loomc.syntax.diagnostics import Diagnostic, LoomSyntaxError
from loomc.syntax.parsed import cached_parse

# Package data (`loomc/grammar/loom.lark`, listed in pyproject's package-data): found the same
# way from a source checkout, an editable install or an installed wheel.
GRAMMAR_PATH = files("loomc") / "grammar" / "loom.lark"

_lock = threading.Lock()
_comment_sink: list[Token] = []


def _collect_comment(tok: Token) -> Token:
    _comment_sink.append(tok)
    return tok


@functools.cache
def parser() -> Lark:
    return Lark(
        GRAMMAR_PATH.read_text(encoding="utf-8"),
        parser="lalr",
        lexer="basic",
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"COMMENT": _collect_comment},
        cache=True,  # LALR tables on disk, keyed by grammar and options: CLI start-up in ms, not 0.3 s
    )


# User-facing spellings for terminals that are not plain strings.
_TERMINAL_NAMES = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a float",
    "STRING": "a string",
    "BYTES": "a bytes literal",
    "$END": "end of file",
}


def terminal_spelling(name: str) -> str:
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    for term in parser().terminals:
        if term.name == name and term.pattern.type == "str":
            return f"'{term.pattern.value}'"
    return name


def parse_module(text: str, path: str = "<input>") -> ast.Module:
    """Parse one `.loom` file. Raises `LoomSyntaxError` (never a lark exception) on bad input.
    A file parsed before comes from the cache of parsed trees (`loomc.syntax.parsed`)."""
    return cached_parse(text, path, _parse)


def _parse(text: str, path: str) -> ast.Module:
    with _lock:
        _comment_sink.clear()
        try:
            tree = parser().parse(text)
        except UnexpectedInput as exc:
            raise LoomSyntaxError(_diagnostic_for(exc, text, path)) from None
        tokens = list(_comment_sink)
    builder = AstBuilder(path, text)
    try:
        items = builder.module(tree)
    except TooDeep as exc:
        raise LoomSyntaxError(Diagnostic(path, exc.span.line, exc.span.column, "L0109",
                                         f"nesting deeper than {MAX_NESTING} levels of expressions and blocks",
                                         notes=("split the expression with `let`",))) from None
    if builder.diagnostics:
        raise LoomSyntaxError(min(builder.diagnostics, key=lambda d: d.sort_key))
    return ast.Module(path, items, _comments(tokens, text), text)


def _comments(tokens: list[Token], text: str) -> list[ast.Comment]:
    lines = text.split("\n")  # lark counts lines by \n only
    out = []
    for tok in tokens:
        before = lines[tok.line - 1][: tok.column - 1] if tok.line <= len(lines) else ""
        out.append(ast.Comment(str(tok).rstrip(), tok.line, tok.column, trailing=bool(before.strip())))
    return out


def _diagnostic_for(exc: UnexpectedInput, text: str, path: str) -> Diagnostic:
    from loomc.syntax.errors import match_example

    line, column = exc.line, exc.column
    if isinstance(exc, UnexpectedCharacters):
        ch = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        if ch == '"' or text[exc.pos_in_stream: exc.pos_in_stream + 2] == 'b"':
            return Diagnostic(path, line, column, "L0102", "unterminated string literal",
                              notes=("a string must close with '\"' on the same line",))
        return Diagnostic(path, line, column, "L0101", f"unexpected character {ch!r}")
    expected = tuple(sorted({terminal_spelling(t) for t in (exc.expected or ()) if not t.startswith("__")} |
                            {terminal_spelling(t) for t in (exc.expected or ()) if t.startswith("__")}))
    found = "end of file"
    if isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        found = repr(str(exc.token))
    if isinstance(exc, UnexpectedEOF) or found == "end of file":
        line, column = _end_position(text)
    labelled = match_example(exc, text)
    if labelled is not None:
        code, message = labelled
        return Diagnostic(path, line, column, code, f"{message}, found {found}", expected=expected)
    if found == "end of file":
        opener = _unclosed_bracket(text)
        message = "unexpected end of file"
        if opener is not None:
            ch, at_line, at_col = opener
            message += f": '{ch}' opened at {at_line}:{at_col} is never closed"
        return Diagnostic(path, line, column, "L0103", message, expected=expected)
    return Diagnostic(path, line, column, "L0100", f"unexpected {found}", expected=expected,
                      notes=(f"expected one of: {', '.join(expected)}",) if expected else ())


def _unclosed_bracket(text: str) -> tuple[str, int, int] | None:
    """The innermost bracket still open at end of input, skipping strings and comments."""
    stack: list[tuple[str, int, int]] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    line, col, i, n = 1, 1, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "/" and text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if ch == '"':
            i += 1
            col += 1
            while i < n and text[i] not in '"\n':
                step = 2 if text[i] == "\\" else 1
                i += step
                col += step
            i += 1
            col += 1
            continue
        if ch in "([{":
            stack.append((ch, line, col))
        elif ch in pairs and stack and stack[-1][0] == pairs[ch]:
            stack.pop()
        if ch == "\n":
            line, col = line + 1, 1
        else:
            col += 1
        i += 1
    return stack[-1] if stack else None


def _end_position(text: str) -> tuple[int, int]:
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1
