"""The `attention` motif: bit for bit split_heads, `bmm`, softmax_scaled, `bmm` and merge_heads,
without copying the heads out or writing the scores.

docs/language.md §11: attention(qkv, heads, tokens, scale, y) computes what split_heads(qkv,
heads, q, k, vt), bmm(q, k, s), softmax_scaled(s, scale), bmm(s, vt, o) and merge_heads(o,
heads, y) compute, every element the same operations in the same order. So the reference is
those calls, and equality is the contract; torch's scaled_dot_product_attention checks the
attention itself, within rounding.
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
_PROGRAMS: dict[tuple[int, int], dict] = {}


def programs(tmp_path_factory, heads: int, tokens: int) -> dict:
    """The fixture's commands with its `heads` and `tokens` configs set (compiled once per pair)."""
    if (heads, tokens) not in _PROGRAMS:
        text = FIXTURE.read_text().replace("config heads: i64 = 2", f"config heads: i64 = {heads}")
        path = tmp_path_factory.mktemp("attention") / "attention.loom"
        path.write_text(text.replace("config tokens: i64 = 17", f"config tokens: i64 = {tokens}"))
        checked = load_files([path])
        assert checked.ok, checked.diagnostics
        _PROGRAMS[heads, tokens] = {name: compile_command(checked, name) for name in ("fused", "unfused", "per_call")}
    return _PROGRAMS[heads, tokens]


def run(program, qkv, scale, **extra):
    return program.run({}, {}, {"qkv": qkv, "scale": scale, **extra})["y"]


def fused_qkv(rng, sequences, tokens, heads, head_dim, spread=1.0):
    return (spread * rng.standard_normal((sequences * tokens, 3 * heads * head_dim))).astype(np.float32)


# (sequences, tokens, heads, features per head): one of each, partial blocks of 16 queries and
# keys, more keys than one slice of the output tile (384), heads of 5, 64, 80 and 256 features,
# and the vision encoder's and the recognizer's own shapes
SHAPES = [(1, 1, 1, 1), (2, 17, 2, 5), (3, 40, 1, 64), (2, 401, 1, 80), (1, 16, 1, 256), (2, 257, 6, 64),
          (1, 1500, 6, 64)]


@pytest.mark.parametrize("sequences, tokens, heads, e", SHAPES)
def test_equals_split_bmm_softmax_bmm_merge_bit_for_bit(tmp_path_factory, rng, sequences, tokens, heads, e):
    p = programs(tmp_path_factory, heads, tokens)
    qkv = fused_qkv(rng, sequences, tokens, heads, e)
    scale = float(np.float32(e ** -0.5))
    np.testing.assert_array_equal(run(p["fused"], qkv, scale), run(p["unfused"], qkv, scale))


def test_large_scores_clamp_like_softmax_scaled(tmp_path_factory, rng):
    # scores far apart: most exps underflow at the -87 clamp, the row max still gives 1
    p = programs(tmp_path_factory, 2, 17)
    qkv = fused_qkv(rng, 3, 17, 2, 16, spread=8.0)
    np.testing.assert_array_equal(run(p["fused"], qkv, 1.0), run(p["unfused"], qkv, 1.0))


def test_is_torch_attention(tmp_path_factory, rng):
    sequences, tokens, heads, e = 2, 37, 3, 24
    qkv = fused_qkv(rng, sequences, tokens, heads, e)
    parts = torch.from_numpy(qkv).reshape(sequences, tokens, 3, heads, e).permute(2, 0, 3, 1, 4)  # [3, B, H, S, E]
    want = F.scaled_dot_product_attention(parts[0], parts[1], parts[2])      # [B, H, S, E]
    want = want.permute(0, 2, 1, 3).reshape(sequences * tokens, heads * e).numpy()
    got = run(programs(tmp_path_factory, heads, tokens)["fused"], qkv, e ** -0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_sequence_gives_the_same_bits_alone_or_batched(tmp_path_factory, rng):
    p = programs(tmp_path_factory, 2, 17)
    qkv = fused_qkv(rng, 3, 17, 2, 32)
    batch = run(p["fused"], qkv, 0.25)
    alone = run(p["fused"], qkv[17:34].copy(), 0.25)
    np.testing.assert_array_equal(alone, batch[17:34])


def test_shapes_its_signature_cannot_check_are_refused_with_the_source_line(tmp_path_factory, rng):
    p = programs(tmp_path_factory, 2, 17)
    with pytest.raises(DispatchError, match=r"attention at .*attention\.loom:12: 30 rows are not whole sequences of 17"):
        run(p["fused"], fused_qkv(rng, 1, 30, 2, 4), 1.0)
    with pytest.raises(DispatchError, match=r"not q, k and v of 2 heads side by side"):
        run(p["fused"], np.zeros((17, 9), np.float32), 1.0)
    wide = programs(tmp_path_factory, 1, 2)
    with pytest.raises(DispatchError, match=r"heads of 257 features; the motif takes at most 256"):
        run(wide["fused"], fused_qkv(rng, 1, 2, 1, 257), 1.0)


def test_a_sequence_length_from_the_call_is_refused_before_it_runs(tmp_path_factory, rng):
    # the workspace is sized when the call's shapes are bound, before its scalars are known
    p = programs(tmp_path_factory, 2, 17)
    with pytest.raises(DispatchError, match=r"attention at .*attention\.loom:29: heads and tokens decide the workspace"):
        run(p["per_call"], fused_qkv(rng, 1, 17, 2, 4), 1.0, n=17)
