"""A two-layer Llama-like model document run as a command program, against numpy.

The reference keeps each row's keys and values densely and recomputes causal attention
over them; the program keeps them in a paged cache across calls (prefill, then a step
that mixes a continuation chunk, decode tokens, a new row and an idle row)."""

from pathlib import Path

import numpy as np
import pytest
from numerics_testlib import dequantized, quantized

from loomc.check.document import load_document
from loomc.run.compile import compile_command
from loomc.run.errors import BindingError, StageInputError

DOCUMENT = Path(__file__).parent / "fixtures" / "tiny" / "model.json"
LAYERS, DIM, HEADS, KV_HEADS, HD, FFN, VOCAB, PAGE = 2, 64, 4, 2, 16, 96, 80, 4
EPS, BASE = 1e-5, 10000.0


@pytest.fixture(scope="module")
def program():
    checked = load_document(DOCUMENT)
    assert checked.ok, checked.diagnostics
    return compile_command(checked, "prefill_decode")


@pytest.fixture(scope="module")
def weights():
    """(params for the program, dequantized float64 weights for the reference)."""
    rng = np.random.default_rng(7)
    params, ref = {}, {}

    def q(name, qtype, rows, cols, scale, layer=None):
        blocks, w = quantized(rng, qtype, rows, cols, scale)
        if layer is None:
            params[name], ref[name] = blocks, w.astype(np.float64)
        else:
            params.setdefault(name, []).append(blocks)
            ref.setdefault(name, []).append(w.astype(np.float64))

    def f(name, shape, layer=None, base=0.0, scale=1.0):
        w = (base + scale * rng.standard_normal(shape)).astype(np.float32)
        if layer is None:
            params[name], ref[name] = w, w.astype(np.float64)
        else:
            params.setdefault(name, []).append(w)
            ref.setdefault(name, []).append(w.astype(np.float64))

    q("token_embd", "q8_0", VOCAB, DIM, 1.0)
    for l in range(LAYERS):
        f("attn_norm", (DIM,), l, 1.0, 0.1)
        q("wq", "q4_0", DIM, DIM, 0.15, l)
        q("wk", "q4_0", KV_HEADS * HD, DIM, 0.15, l)
        q("wv", "q4_1", KV_HEADS * HD, DIM, 0.15, l)
        f("wo", (DIM, DIM), l, 0.0, 0.1)
        f("ffn_norm", (DIM,), l, 1.0, 0.1)
        q("w_gate", "q4_1", FFN, DIM, 0.15, l)
        q("w_up", "q4_1", FFN, DIM, 0.15, l)
        q("w_down", "q4_1", DIM, FFN, 0.1, l)
    f("output_norm", (DIM,), None, 1.0, 0.1)
    return params, ref


def rmsnorm(x, w):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS) * w


def rope(x, position, heads):
    hd = x.shape[-1] // heads
    theta = position * BASE ** (-2.0 * np.arange(hd // 2) / hd)
    out = x.copy()
    for h in range(heads):
        a, b = x[h * hd:(h + 1) * hd:2], x[h * hd + 1:(h + 1) * hd:2]
        out[h * hd:(h + 1) * hd:2] = a * np.cos(theta) - b * np.sin(theta)
        out[h * hd + 1:(h + 1) * hd:2] = a * np.sin(theta) + b * np.cos(theta)
    return out


class Reference:
    """Dense numpy Llama over the same weights; `history[layer][row]` holds (keys, values)."""

    def __init__(self, w):
        self.w = w
        self.history = [dict() for _ in range(LAYERS)]

    def step(self, tokens, positions, rows, last):
        w = self.w
        h = np.array([w["token_embd"][t] if 0 <= t < VOCAB else np.zeros(DIM) for t in tokens])
        for l in range(LAYERS):
            xn = rmsnorm(h, w["attn_norm"][l])
            q, k, v = xn @ w["wq"][l].T, xn @ w["wk"][l].T, xn @ w["wv"][l].T
            att = np.zeros_like(h)
            for t in range(len(tokens)):  # in pack order: a token sees earlier tokens of its chunk
                r, p = rows[t], positions[t]
                keys, values = self.history[l].get(r, (np.zeros((0, KV_HEADS * HD)),) * 2)
                assert len(keys) == p
                keys = np.vstack([keys, rope(k[t], p, KV_HEADS)])
                values = np.vstack([values, v[t]])
                self.history[l][r] = (keys, values)
                qt = rope(q[t], p, HEADS)
                for hh in range(HEADS):
                    g = hh // (HEADS // KV_HEADS)
                    s = keys[:, g * HD:(g + 1) * HD] @ qt[hh * HD:(hh + 1) * HD] / np.sqrt(HD)
                    e = np.exp(s - s.max())
                    att[t, hh * HD:(hh + 1) * HD] = (e / e.sum()) @ values[:, g * HD:(g + 1) * HD]
            h = h + att @ w["wo"][l].T
            xn = rmsnorm(h, w["ffn_norm"][l])
            gate, up = xn @ w["w_gate"][l].T, xn @ w["w_up"][l].T
            h = h + (gate / (1 + np.exp(-gate)) * up) @ w["w_down"][l].T
        last_h = np.array([h[i] if i >= 0 else np.zeros(DIM) for i in last])
        return rmsnorm(last_h, w["output_norm"]) @ w["token_embd"].T


def step_inputs(chunks, num_rows, page_table, temperature=0.0):
    """chunks: [(row, first position, tokens)] in pack order."""
    tokens = np.array([t for _, _, ts in chunks for t in ts], np.int32)
    rows = np.array([r for r, _, ts in chunks for _ in ts], np.int32)
    positions = np.array([p0 + i for _, p0, ts in chunks for i in range(len(ts))], np.int32)
    last = np.full(num_rows, -1, np.int32)
    for i, r in enumerate(rows):
        last[r] = i
    return dict(tokens=tokens, positions=positions, rows=rows, page_table=page_table, last=last,
                temperature=np.full(num_rows, temperature, np.float32), top_p=np.ones(num_rows, np.float32),
                top_k=np.zeros(num_rows, np.int32), seed=np.arange(num_rows, dtype=np.uint64),
                counter=np.zeros(num_rows, np.uint64))


def fresh_state(pages=12):
    shape = (pages, LAYERS, PAGE, KV_HEADS * HD)
    return {"k_cache": np.zeros(shape, np.float32), "v_cache": np.zeros(shape, np.float32)}


def test_two_steps_match_numpy(program, weights):
    params, ref_weights = weights
    rng = np.random.default_rng(3)
    num_rows = 4
    page_table = np.array([[7, 2, 9], [0, 11, 5], [3, 8, 1], [10, 4, 6]], np.int32)
    state = fresh_state()
    reference = Reference(ref_weights)
    toks = lambda n: rng.integers(0, VOCAB, n).tolist()
    steps = [
        [(0, 0, toks(6)), (1, 0, toks(2)), (2, 0, toks(9))],  # prefills; row 3 idle
        [(1, 2, toks(3)), (0, 6, toks(1)), (3, 0, toks(2)), (2, 9, toks(1))],  # chunk, decodes, a new row
    ]
    for chunks in steps:
        inputs = step_inputs(chunks, num_rows, page_table)
        out = program.run(params, state, inputs)
        want = reference.step(inputs["tokens"], inputs["positions"], inputs["rows"], inputs["last"])
        np.testing.assert_allclose(out["logits"], want, rtol=2e-3, atol=2e-3)
        np.testing.assert_array_equal(out["next"], out["logits"].argmax(axis=1))  # temperature 0 is greedy
        top2 = np.sort(want, axis=1)[:, -2:]
        decided = top2[:, 1] - top2[:, 0] > 1e-2
        np.testing.assert_array_equal(out["next"][decided], want.argmax(axis=1)[decided])


def test_sampled_tokens_do_not_depend_on_the_batch(program, weights):
    params, _ = weights
    page_table = np.array([[0, 1], [2, 3], [4, 5]], np.int32)
    chunks = [(0, 0, [5, 6, 7]), (1, 0, [9]), (2, 0, [1, 2])]
    batched = step_inputs(chunks, 3, page_table, temperature=1.0)
    batched["counter"] = np.array([3, 4, 5], np.uint64)
    out_all = program.run(params, fresh_state(), batched)
    alone = step_inputs([(0, 0, [9])], 1, page_table[1:2], temperature=1.0)
    alone["seed"], alone["counter"] = batched["seed"][1:2].copy(), batched["counter"][1:2].copy()
    out_one = program.run(params, fresh_state(), alone)
    assert out_one["next"][0] == out_all["next"][1]
    # Bitwise: every kernel and the `matmul` motif fix each element's reduction order.
    np.testing.assert_array_equal(out_one["logits"][0], out_all["logits"][1])


def test_scratch_shares_memory_across_layers(program, weights):
    params, _ = weights
    inputs = step_inputs([(0, 0, [1, 2, 3])], 1, np.array([[0, 1]], np.int32))
    plan = program.prepare(params, fresh_state(), inputs)
    sizes = sum(a.nbytes for a in plan.scratch.values())
    assert len(plan.scratch) == 14  # 10 vars of the stage's command + gate/up of each inlined feed_forward
    assert plan.arena_bytes < sizes * 0.8
    names = sorted(plan.scratch)
    assert "gate" in names and "gate_1" in names


def test_shapes_share_one_scratch_arena(program, weights):
    """Packed steps give a new shape (T) almost every step: their plans reuse one arena (scratch,
    inputs and results) instead of holding one each, and a larger shape grows it for all of them."""
    params, _ = weights

    def arenas(plan) -> set[int]:
        roots = set()
        for a in [*plan.scratch.values(), *plan.inputs.values(), *plan.results.values()]:
            while a.base is not None:
                a = a.base
            roots.add(id(a))
        return roots

    state = fresh_state()  # one binding (params and state), as a service keeps

    def plan_for(tokens):
        return program.prepare(params, state, step_inputs([(0, 0, tokens)], 1, np.array([[0, 1]], np.int32)))

    small = plan_for([1, 2])
    (small_arena,) = arenas(small)
    large = plan_for([1, 2, 3, 4, 5])
    again = plan_for([3, 1])
    assert len(arenas(large)) == 1 and arenas(again) == arenas(large) != {small_arena}  # grown, then shared
    assert program.scratch_bytes() < large.arena_bytes + large.workspace.nbytes + 4096


def test_a_plan_is_built_once_per_shape_while_shapes_come_and_go(program, weights):
    """Rows joining and leaving a batch, and prefill chunks, cycle through a dozen shapes: each
    plan (3 ms of Python for scout) is built once and found again, and its results are the
    same as a fresh plan's."""
    params, _ = weights
    state = fresh_state()
    shapes = [list(range(1, n + 1)) for n in range(12, 0, -1)]
    first = [program.prepare(params, state, step_inputs([(0, 0, tokens)], 1, np.array([[0, 1]], np.int32)))
             for tokens in shapes]
    again = [program.prepare(params, state, step_inputs([(0, 0, tokens)], 1, np.array([[0, 1]], np.int32)))
             for tokens in shapes]
    assert all(a is b for a, b in zip(first, again))


def test_inputs_that_disagree_with_the_stage_are_rejected(program, weights):
    params, _ = weights
    good = step_inputs([(0, 0, [1, 2, 3])], 2, np.array([[0, 1], [2, 3]], np.int32))
    cases = {
        "positions": (np.zeros(4, np.int32), r"'positions' must be i32\[T\] = i32\[3\] with P = 2, R = 2, T = 3"),
        "tokens": (np.zeros(3, np.int64), "'tokens' is i32: expected a int32 array, got int64"),
        "page_table": (np.zeros(6, np.int32), "expected 2 dimensions, got 1"),
        "seed": (np.zeros(3, np.uint64), r"'seed' must be u64\[R\]"),
    }
    for name, (value, message) in cases.items():
        with pytest.raises(StageInputError, match=message):
            program.run(params, fresh_state(), {**good, name: value})
    with pytest.raises(StageInputError, match="needs 'last'"):
        program.run(params, fresh_state(), {k: v for k, v in good.items() if k != "last"})
    with pytest.raises(StageInputError, match="no argument 'extra'"):
        program.run(params, fresh_state(), {**good, "extra": 1})
    assert isinstance(StageInputError("x"), ValueError)


def test_inputs_like_an_earlier_call_s_are_checked_again_when_they_differ(program, weights):
    """A binding remembers what the checks concluded for inputs of the same names, dtypes and
    shapes; any difference in those is checked afresh, after good calls of the same binding."""
    params, _ = weights
    state = fresh_state()
    good = step_inputs([(0, 0, [1, 2, 3])], 2, np.array([[0, 1], [2, 3]], np.int32))
    first = program.prepare(params, state, good)
    assert program.prepare(params, state, {k: v.copy() for k, v in good.items()}) is first
    cases = {
        "positions": (np.zeros(4, np.int32), r"'positions' must be i32\[T\] = i32\[3\]"),
        "tokens": (np.zeros(3, np.int64), "'tokens' is i32: expected a int32 array, got int64"),
        "page_table": (np.zeros(4, np.int32), "expected 2 dimensions, got 1"),
        "last": ([1, 2], "'last' must be a numpy array, got list"),
    }
    for name, (value, message) in cases.items():
        for _ in range(2):   # a refusal is never remembered
            with pytest.raises(StageInputError, match=message):
                program.prepare(params, state, {**good, name: value})
    longer = step_inputs([(0, 0, [1, 2, 3, 4])], 2, np.array([[0, 1], [2, 3]], np.int32))
    assert program.prepare(params, state, longer).env["T"] == 4
    assert program.prepare(params, state, good).env["T"] == 3


def test_params_and_state_are_checked_when_bound(program, weights):
    params, _ = weights
    inputs = step_inputs([(0, 0, [1])], 1, np.array([[0]], np.int32))
    with pytest.raises(BindingError, match=r"param 'output_norm' must be f32\[64\], got float32\[63\]"):
        program.run({**params, "output_norm": np.zeros(63, np.float32)}, fresh_state(), inputs)
    with pytest.raises(BindingError, match=r"param 'wq\[1\]' must be q4_0\[64, 64\] \(GGUF bytes: uint8\[64, 36\]\)"):
        program.run({**params, "wq": [params["wq"][0], np.zeros((64, 64), np.uint8)]}, fresh_state(), inputs)
    with pytest.raises(BindingError, match="family 'wk' has 2 members"):
        program.run({**params, "wk": params["wk"][:1]}, fresh_state(), inputs)
    with pytest.raises(BindingError, match="state 'v_cache' has 5 <pages>, another state has 12"):
        program.run(params, {**fresh_state(), "v_cache": fresh_state(5)["v_cache"]}, inputs)
