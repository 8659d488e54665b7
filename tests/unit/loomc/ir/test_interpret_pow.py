"""The reference interpreter's pow follows C99 (numba's math.pow, CUDA's pow), not numpy."""

import math

import pytest

from loomc.ir.interpret import _c_pow


@pytest.mark.parametrize("x,y,want", [
    (-math.inf, 0.5, math.inf),
    (0.0, -1.0, math.inf),
    (-0.0, -1.0, -math.inf),
    (-0.0, -2.0, math.inf),
    (-10.0, 1001.0, -math.inf),
    (10.0, 1001.0, math.inf),
    (2.0, 3.0, 8.0),
    (math.nan, 0.0, 1.0),
    (1.0, math.nan, 1.0),
])
def test_c99_special_cases(x, y, want):
    got = _c_pow(x, y)
    assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want)


def test_negative_base_with_fractional_exponent_is_nan():
    assert math.isnan(_c_pow(-2.0, 0.5))
