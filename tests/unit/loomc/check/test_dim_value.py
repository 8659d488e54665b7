"""`Dim.value`: a shape plan's fast evaluation gives what substitution gives, on every form."""

from __future__ import annotations

import itertools

import pytest

from loomc.check.shapes import Dim

T, R, P = Dim.symbol("T"), Dim.symbol("R"), Dim.symbol("P")


def by_substitution(d: Dim, env: dict[str, int]) -> int | None:
    return d.substitute({name: Dim.const(v) for name, v in env.items()}).constant


FORMS = {
    "constant": Dim.const(576),
    "zero": Dim.const(0),
    "symbol": T,
    "polynomial": T * R * Dim.const(3) + P - Dim.const(7),
    "exact division": (T * Dim.const(4)).divide(Dim.const(2)),
    "symbolic division": T.divide(R),
    "remainder": T.modulo(R),
    "nested": (T * P).divide(R).modulo(Dim.const(5)) + T.divide(Dim.const(3)),
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_value_is_what_substitution_gives(name):
    d = FORMS[name]
    for t, r, p in itertools.product((0, 1, 6, 7, 12), (0, 2, 3, 4), (1, 5)):
        env = {"T": t, "R": r, "P": p}
        assert d.value(env) == by_substitution(d, env), (str(d), env)


def test_an_unbound_symbol_or_inexact_division_has_no_value():
    assert T.value({"R": 3}) is None
    assert T.divide(R).value({"T": 7, "R": 2}) is None
    assert T.divide(R).value({"T": 8, "R": 0}) is None
    assert T.modulo(R).value({"T": 8, "R": 0}) is None
