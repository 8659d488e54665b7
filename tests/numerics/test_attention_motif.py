"""The `attention` motif: bit for bit `bmm`, softmax_scaled and `bmm`, without writing the scores.

docs/language.md §11: attention(q, k, vt, scale, o) computes what bmm(q, k, s),
softmax_scaled(s, scale) and bmm(s, vt, o) compute, every element the same operations in the
same order. So the reference is those calls, and equality is the contract; torch's
scaled_dot_product_attention checks the attention itself, within rounding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from loomc.check import load_files
from loomc.run.compile import compile_command
from loomc.run.dispatch import DispatchError

FIXTURE = Path(__file__).parent / "fixtures" / "attention.loom"


@pytest.fixture(scope="module")
def programs():
    checked = load_files([FIXTURE])
    assert checked.ok, checked.diagnostics
    return {name: compile_command(checked, name) for name in ("fused", "unfused")}


def run(program, q, k, v, scale):
    vt = np.ascontiguousarray(v.transpose(0, 2, 1))
    return program.run({}, {}, {"q": q, "k": k, "vt": vt, "scale": scale})["o"]


def qkv(rng, g, m, n, e, spread=1.0):
    return tuple((spread * rng.standard_normal(shape)).astype(np.float32) for shape in ((g, m, e), (g, n, e), (g, n, e)))


# (groups, query rows, keys, head size): one of each, partial blocks of 16 rows on both sides,
# more keys than one slice of the output tile (384), heads of 5, 64, 80 and 256 features, and
# the recognizer's and the vision encoder's own shapes
SHAPES = [(1, 1, 1, 1), (2, 17, 33, 5), (3, 40, 20, 64), (2, 100, 401, 80), (1, 16, 16, 256), (2, 257, 257, 64),
          (6, 1500, 1500, 64)]


@pytest.mark.parametrize("g, m, n, e", SHAPES)
def test_equals_bmm_softmax_bmm_bit_for_bit(programs, rng, g, m, n, e):
    q, k, v = qkv(rng, g, m, n, e)
    scale = float(np.float32(e ** -0.5))
    np.testing.assert_array_equal(run(programs["fused"], q, k, v, scale), run(programs["unfused"], q, k, v, scale))


def test_large_scores_clamp_like_softmax_scaled(programs, rng):
    # scores far apart: most exps underflow at the -87 clamp, the row max still gives 1
    q, k, v = qkv(rng, 2, 30, 50, 16, spread=8.0)
    np.testing.assert_array_equal(run(programs["fused"], q, k, v, 1.0), run(programs["unfused"], q, k, v, 1.0))


def test_is_torch_attention(programs, rng):
    q, k, v = qkv(rng, 4, 37, 29, 24)
    scale = 24 ** -0.5
    want = F.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v)).numpy()
    np.testing.assert_allclose(run(programs["fused"], q, k, v, scale), want, rtol=1e-5, atol=1e-5)


def test_a_group_gives_the_same_bits_alone_or_batched(programs, rng):
    q, k, v = qkv(rng, 3, 45, 70, 32)
    batch = run(programs["fused"], q, k, v, 0.25)
    alone = run(programs["fused"], q[1:2].copy(), k[1:2].copy(), v[1:2].copy(), 0.25)
    np.testing.assert_array_equal(alone, batch[1:2])


def test_heads_past_the_limit_are_refused_with_the_source_line(programs, rng):
    q, k, v = qkv(rng, 1, 2, 3, 257)
    with pytest.raises(DispatchError, match=r"attention at .*attention\.loom:7: heads of 257 features"):
        run(programs["fused"], q, k, v, 1.0)
