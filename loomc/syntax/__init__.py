"""The `.loom` front end: lark grammar → typed AST with source spans, diagnostics, canonical printer."""

from loomc.syntax.diagnostics import Diagnostic, LoomSyntaxError
from loomc.syntax.parse import parse_module

__all__ = ["Diagnostic", "LoomSyntaxError", "parse_module"]
