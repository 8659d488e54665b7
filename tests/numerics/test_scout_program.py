"""The whole scout sample (SmolLM2-135M, 30 layers) lowers and runs on random weights of its shapes."""

from pathlib import Path

import numpy as np
import pytest
from numerics_testlib import random_blocks

from loomc.check.document import load_document
from loomc.dtypes import DTYPES, PANEL_TYPES
from loomc.run.compile import compile_command

SCOUT = Path(__file__).resolve().parents[2] / "samples" / "scout" / "model.json"


def random_params(plan, rng):
    params = {}
    for name, spec in plan.params.items():
        dims = tuple(d.constant for d in spec.dims)

        def one():
            if spec.dtype in ("q4_0", "q4_1", "q8_0", *PANEL_TYPES):   # random blocks: a panel's order is as random
                plain = DTYPES[spec.dtype].panel_of or spec.dtype
                return random_blocks(rng, plain, dims, scale=0.01 if plain == "q4_1" else 0.02)
            return (1.0 + 0.05 * rng.standard_normal(dims)).astype(np.float32)

        params[name] = [one() for _ in range(*spec.family)] if spec.family else one()
    return params


@pytest.fixture(scope="module")
def scout():
    checked = load_document(SCOUT)
    assert checked.ok, checked.diagnostics
    program = compile_command(checked, "prefill_decode")
    return program, random_params(program.plan, np.random.default_rng(11))


def test_scout_prefill_decode_runs(scout):
    program, params = scout
    plan = program.plan
    assert len(plan.dispatches) == 2 + 2 + 30 * 9 + 4  # embed, place image rows, rope table, first norm, 9 per layer, gather, norm, LM head, sample
    assert plan.params["wqkv"].family == (0, 30) and plan.params["wqkv"].dtype == "q4_1x16" and plan.params["token_embd"].dtype == "q8_0"
    assert plan.params["lm_head"].dtype == "q8_0x16"
    pages = 8
    shape = (pages, 30, 16, 192)
    state = {"k_cache": np.zeros(shape, np.float32), "v_cache": np.zeros(shape, np.float16)}   # samples/scout/model.loom
    lengths = [5, 2]
    inputs = {
        "tokens": np.array([1, 9690, 28, 2, 11, 1, 4093], np.int32),
        "positions": np.array([0, 1, 2, 3, 4, 0, 1], np.int32),
        "rows": np.repeat(np.arange(2), lengths).astype(np.int32),
        "page_table": np.array([[5, -1], [2, -1]], np.int32),
        "last": np.cumsum(lengths).astype(np.int32) - 1,
        "temperature": np.array([0.0, 0.8], np.float32),
        "top_p": np.array([1.0, 0.9], np.float32),
        "top_k": np.array([0, 40], np.int32),
        "seed": np.array([1, 2], np.uint64),
        "counter": np.array([0, 0], np.uint64),
        "embeds": np.zeros((0, 576), np.float32),     # no image positions in this step
        "embed_at": np.zeros(0, np.int32),
    }
    out = program.run(params, state, inputs)
    assert out["next"].dtype == np.int32 and out["next"].shape == (2,)
    assert ((out["next"] >= 0) & (out["next"] < 49152)).all()
    written = {p for p in range(pages) if state["k_cache"][p].any()}
    assert written == {5, 2}  # only the pages in the table
    assert state["k_cache"][5, :, :5].any(axis=-1).all() and not state["k_cache"][5, :, 5:].any()
    again = program.run(params, {k: np.zeros_like(v) for k, v in state.items()}, inputs)
    np.testing.assert_array_equal(again["next"], out["next"])  # deterministic, sampled row included
