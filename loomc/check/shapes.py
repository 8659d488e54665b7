"""Tensor dimensions: integers, config names (folded to their values) and per-call symbols.

A `Dim` is a normalised polynomial over symbol names with integer coefficients,
so `heads * head_dim` and `576` compare equal once configs are folded, and
`2 * T` equals `T + T`. Anything that cannot be normalised (a symbolic
division) becomes an opaque atom compared by its text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Dim:
    terms: tuple[tuple[tuple[str, ...], int], ...]  # sorted (monomial, coefficient), nonzero coefficients

    @staticmethod
    def const(value: int) -> "Dim":
        return Dim(((((), value),) if value else ()))

    @staticmethod
    def symbol(name: str) -> "Dim":
        return Dim((((name,), 1),))

    @staticmethod
    def _make(acc: dict[tuple[str, ...], int]) -> "Dim":
        return Dim(tuple(sorted((m, c) for m, c in acc.items() if c)))

    @property
    def constant(self) -> int | None:
        if not self.terms:
            return 0
        if len(self.terms) == 1 and self.terms[0][0] == ():
            return self.terms[0][1]
        return None

    @property
    def bare_symbol(self) -> str | None:
        if len(self.terms) == 1 and len(self.terms[0][0]) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0][0]
        return None

    def __add__(self, other: "Dim") -> "Dim":
        acc = dict(self.terms)
        for m, c in other.terms:
            acc[m] = acc.get(m, 0) + c
        return Dim._make(acc)

    def __neg__(self) -> "Dim":
        return Dim(tuple((m, -c) for m, c in self.terms))

    def __sub__(self, other: "Dim") -> "Dim":
        return self + (-other)

    def __mul__(self, other: "Dim") -> "Dim":
        acc: dict[tuple[str, ...], int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = tuple(sorted(m1 + m2))
                acc[m] = acc.get(m, 0) + c1 * c2
        return Dim._make(acc)

    def divide(self, other: "Dim") -> "Dim":
        """Exact division by a constant stays polynomial; anything else becomes an opaque atom."""
        k = other.constant
        if k and all(c % k == 0 for _, c in self.terms):
            return Dim(tuple((m, c // k) for m, c in self.terms))
        return _opaque("/", self, other)

    def modulo(self, other: "Dim") -> "Dim":
        a, b = self.constant, other.constant
        if a is not None and b:
            return Dim.const(a % b)
        return _opaque("%", self, other)

    def symbols(self) -> set[str]:
        """Every symbol this dimension depends on, looking inside opaque atoms."""
        out: set[str] = set()
        for m, _ in self.terms:
            for s in m:
                if s in _OPAQUE:
                    _, a, b = _OPAQUE[s]
                    out |= a.symbols() | b.symbols()
                else:
                    out.add(s)
        return out

    def substitute(self, bindings: dict[str, "Dim"]) -> "Dim":
        out = Dim.const(0)
        for m, c in self.terms:
            term = Dim.const(c)
            for s in m:
                if s in _OPAQUE:
                    op, a, b = _OPAQUE[s]
                    a, b = a.substitute(bindings), b.substitute(bindings)
                    term = term * (a.divide(b) if op == "/" else a.modulo(b))
                else:
                    term = term * bindings.get(s, Dim.symbol(s))
            out = out + term
        return out

    def value(self, env: Mapping[str, int]) -> int | None:
        """The integer this dimension takes when every symbol has its value in `env`: what
        `substitute` with constants then `constant` give (None where a symbol is unbound or a
        division is not exact), without building a Dim per step. A command's shape plan
        evaluates thousands of dimensions for every new combination of per-call sizes (a
        speaker's sentence of a new length: 20 ms by substitution)."""
        total = 0
        for m, c in self.terms:
            term = c
            for s in m:
                if s in _OPAQUE:
                    op, a, b = _OPAQUE[s]
                    x, y = a.value(env), b.value(env)
                    if x is None or not y or (op == "/" and x % y):
                        return None
                    term *= x // y if op == "/" else x % y
                else:
                    v = env.get(s)
                    if v is None:
                        return None
                    term *= v
            total += term
        return total

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m, c in self.terms:
            body = "*".join(m)
            if not m:
                parts.append(str(c))
            elif c == 1:
                parts.append(body)
            elif c == -1:
                parts.append("-" + body)
            else:
                parts.append(f"{c}*{body}")
        return " + ".join(parts).replace("+ -", "- ")


# Opaque atoms (a symbolic division or remainder) are symbols whose name is their text;
# this table keeps their structure so substitution can evaluate them once operands are known.
_OPAQUE: dict[str, tuple[str, Dim, Dim]] = {}


def _opaque(op: str, a: Dim, b: Dim) -> Dim:
    name = f"({a} {op} {b})"
    _OPAQUE.setdefault(name, (op, a, b))
    return Dim.symbol(name)
