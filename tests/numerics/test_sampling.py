"""argmax and sample: greedy rules, reproducible draws per row, and the sampled distributions."""

import numpy as np
import pytest

MASK = (1 << 64) - 1


def splitmix_uniform(seed: int, counter: int) -> float:
    """Draw number `counter` of the splitmix64 stream seeded with `seed`, as the kernel
    documents it: top 24 bits of mix(seed + (counter + 1) * golden), scaled by 2^-24."""
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    z ^= z >> 31
    return (z >> 40) / float(1 << 24)


def run_sample(kernel, logits, temperature, top_p, top_k, seed, counter):
    rows = logits.shape[0]
    as_row = lambda v, t: np.broadcast_to(np.asarray(v, t), (rows,)).copy()
    scratch = np.zeros_like(logits)
    out = np.full(rows, -7, np.int32)
    kernel("sample")(logits, as_row(temperature, np.float32), as_row(top_p, np.float32), as_row(top_k, np.int32),
                     as_row(seed, np.uint64), as_row(counter, np.uint64), scratch, out)
    return out


@pytest.mark.parametrize("rows,vocab", [(1, 1), (3, 10), (5, 1000), (2, 49157)])
def test_argmax(kernel, rng, rows, vocab):
    logits = rng.standard_normal((rows, vocab)).astype(np.float32)
    out = np.zeros(rows, np.int32)
    kernel("argmax")(logits, out)
    np.testing.assert_array_equal(out, logits.argmax(axis=1))


def test_argmax_ties_go_to_the_lower_id_and_nan_never_wins(kernel):
    logits = np.array([[1.0, 3.0, 3.0, 2.0], [np.nan, 0.5, np.nan, 0.5], [-np.inf] * 4], np.float32)
    out = np.zeros(3, np.int32)
    kernel("argmax")(logits, out)
    assert out.tolist() == [1, 1, 0]


@pytest.mark.parametrize("kernel_name", ["argmax", "sample"])
def test_the_first_of_equal_largest_logits_wins_across_lanes_and_the_tail(kernel, kernel_name):
    # the scan runs in 32 lanes (sampling.loom's argmax_lanes; lane z: ids z, z + 32, ...)
    # and the ids past the last whole 32; the lanes' winners are compared at the end, ties to
    # the lower id, then the ids past them, each only when strictly larger
    vocab = 32 * 20 + 5
    logits = np.full((6, vocab), -1.0, np.float32)
    logits[0, [549, 37, 53, 500]] = 4.0            # equal largest in lanes 5, 5, 21 and 20: 37 wins
    logits[1, [643, 644, 300]] = 9.0                # in the tail and lane 12: 300
    logits[2, [642, 640]] = 9.0                     # only in the tail: 640
    logits[3] = np.nan
    logits[3, 77] = -5.0                            # NaN never wins, even against one number
    logits[4] = -np.inf                             # nothing beats the start: id 0
    logits[5, 3] = -0.0
    logits[5, 1:3] = 0.0                            # -0.0 == +0.0: the first of them, 1
    out = np.zeros(6, np.int32)
    if kernel_name == "argmax":
        kernel("argmax")(logits, out)
    else:
        out = run_sample(kernel, logits, 0.0, 1.0, 0, 1, 0)
    assert out.tolist() == [37, 300, 640, 77, 0, 1]


@pytest.mark.parametrize("vocab", [7, 300, 4099])
def test_greedy_settings_equal_argmax(kernel, rng, vocab):
    logits = (rng.standard_normal((6, vocab)) * 3).astype(np.float32)
    want = logits.argmax(axis=1)
    for temperature, top_k in ((0.0, 0), (0.0, 40), (np.nan, 0), (1.0, 1), (-1.0, 5)):
        got = run_sample(kernel, logits, temperature, 0.9, top_k, 1234, 5)
        np.testing.assert_array_equal(got, want, err_msg=f"temperature={temperature} top_k={top_k}")


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (0, 0.8), (20, 1.0), (20, 0.6)])
def test_a_rows_draw_does_not_depend_on_the_batch(kernel, rng, top_k, top_p):
    vocab = 257
    logits = rng.standard_normal((5, vocab)).astype(np.float32) * 2
    seeds = rng.integers(0, 2 ** 63, 5, dtype=np.uint64)
    counters = rng.integers(0, 1000, 5, dtype=np.uint64)
    batched = run_sample(kernel, logits, 0.9, top_p, top_k, seeds, counters)
    for r in range(5):
        alone = run_sample(kernel, logits[r:r + 1].copy(), 0.9, top_p, top_k, seeds[r], counters[r])
        assert alone[0] == batched[r]
    shuffled = np.array([4, 2, 0, 3, 1])
    again = run_sample(kernel, logits[shuffled].copy(), 0.9, top_p, top_k, seeds[shuffled], counters[shuffled])
    np.testing.assert_array_equal(again, batched[shuffled])


def test_draws_follow_the_inverse_cdf_of_the_softmax(kernel):
    """Without top-k/top-p, draw i is the first id whose cumulative probability (in id order)
    exceeds u_i, with u_i from splitmix64(seed, counter = i)."""
    logits = np.array([0.3, -1.0, 2.0, 0.0, 1.1, -0.4], np.float32)
    draws, seed, temperature = 2000, 77, 0.7
    got = run_sample(kernel, np.tile(logits, (draws, 1)), temperature, 1.0, 0, seed, np.arange(draws, dtype=np.uint64))
    p = np.exp((logits.astype(np.float64) - logits.max()) / temperature)
    cdf = np.cumsum(p / p.sum())
    checked = 0
    for i in range(draws):
        u = splitmix_uniform(seed, i)
        if np.min(np.abs(cdf - u)) < 1e-5:
            continue  # too close to a boundary for f32 rounding to be decided
        assert got[i] == int(np.searchsorted(cdf, u, side="right")), i
        checked += 1
    assert checked > 0.99 * draws


@pytest.mark.parametrize("top_k,top_p,support", [
    (2, 1.0, {2, 4}),  # the two largest logits
    (0, 0.7, {2, 4}),  # nucleus by bisection: p ~ [.10 .03 .54 .07 .22 .05]; .54 + .22 reaches 0.7
    (4, 0.7, {2, 4}),  # nucleus inside the top-k candidates
    (3, 1.0, {0, 2, 4}),
])
def test_top_k_and_top_p_restrict_the_support(kernel, top_k, top_p, support):
    logits = np.array([0.3, -1.0, 2.0, 0.0, 1.1, -0.4], np.float32)
    draws = 3000
    got = run_sample(kernel, np.tile(logits, (draws, 1)), 1.0, top_p, top_k, 9, np.arange(draws, dtype=np.uint64))
    assert set(got.tolist()) == support
    p = np.exp(logits.astype(np.float64) - logits.max())
    keep = np.array(sorted(support))
    want = p[keep] / p[keep].sum()
    freq = np.array([(got == i).mean() for i in keep])
    np.testing.assert_allclose(freq, want, atol=0.03)


def test_top_k_above_the_local_limit_is_clamped(kernel, rng):
    logits = rng.standard_normal((2, 500)).astype(np.float32)
    got = run_sample(kernel, logits, 1.0, 1.0, 400, 3, 1)  # max_top_k is 64
    for r in range(2):
        assert got[r] in np.argsort(-logits[r])[:64]
