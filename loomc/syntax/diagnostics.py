"""Diagnostics: one positioned message type shared by the parser and the checker.

Positions are data; rendering is separate and takes the source text, as lark's
`get_context` does, so a diagnostic can be produced without holding the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Diagnostic:
    path: str
    line: int
    column: int
    code: str
    message: str
    severity: str = "error"
    end_line: int | None = None
    end_column: int | None = None
    expected: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def sort_key(self) -> tuple:
        return (self.path, self.line, self.column, self.code, self.message)

    def header(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.severity}[{self.code}]: {self.message}"

    def render(self, source: str | None) -> str:
        """`path:line:col: error[CODE]: message`, then the source line and a caret."""
        out = [self.header()]
        if source is not None:
            lines = source.split("\n")
            if 1 <= self.line <= len(lines):
                text = lines[self.line - 1].replace("\t", " ")
                gutter = f"{self.line:>5} | "
                out.append(gutter + text)
                width = 1
                if self.end_line == self.line and self.end_column and self.end_column > self.column:
                    width = self.end_column - self.column
                out.append(" " * (len(gutter) - 2) + "| " + " " * (self.column - 1) + "^" * width)
        for note in self.notes:
            out.append(f"      = note: {note}")
        return "\n".join(out)

    def to_json(self) -> dict:
        data = {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
        }
        if self.end_line is not None:
            data["end_line"] = self.end_line
            data["end_column"] = self.end_column
        if self.expected:
            data["expected"] = list(self.expected)
        if self.notes:
            data["notes"] = list(self.notes)
        return data


class LoomSyntaxError(Exception):
    """Raised by `parse_module` when a file does not parse; carries exactly one diagnostic."""

    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.header())
        self.diagnostic = diagnostic
