"""Speech benchmark: the speaker sample (hibari's af_heart voice in .loom) against hibari's own pipeline.

Run by hand (never in CI):  .venv/bin/python bench/speak.py [--repeats 5] [--threads 2]

Both synthesize the same text with the same voice and thread count: Loom in process through
the registry (`inference.speak`: the policy's G2P and sentence blocks, the `durations` and
`synthesize` stages with the vocoder), hibari (`hibari.Hibari(threads=T).stream`: the same
G2P, onnxruntime, numpy's vocoder) in a child process, because onnxruntime's spinning worker
threads would otherwise take the cores from Loom's. Two texts: a short sentence and a
five-sentence paragraph; two workloads: one request alone, and 4 at once (Loom: 4
concurrent requests sharing the service's calls; hibari: 4 threads on one session, which
has no batching). Every repeat speaks a variant of the text that no earlier call spoke (one
more word in each sentence, a different one each time), as real requests do: a sentence of a
new length is a new shape for Loom's compiled commands, whose plans a repeated text would
find ready. The engines alternate; the script prints, per case, the median time to
the first audio block, the real-time factor as seconds of audio per second of wall time,
and the ratios Loom / hibari, with the machine's CPU class.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from machine import describe  # noqa: E402  (bench/machine.py, beside this script)
from sample_registry import ready_sample  # noqa: E402

RATE = 24000
SHORT = "Good day, how are you doing this morning?"
PARAGRAPH = ("The sun rose over the quiet harbor. Fishermen loaded their boats with nets. A gull cried above "
             "the water. Children ran along the old stone pier. By noon the market was full of voices.")


class Loom:
    def __init__(self):
        self.registry, self.reg = ready_sample("speaker")

    def speak(self, text: str, copies: int) -> tuple[float, float, float]:
        """(seconds to the first audio block (median over the copies), wall seconds, audio seconds)."""
        from loomrt.inference import speak

        start = time.perf_counter()
        jobs = [speak(self.registry, self.reg.name, {"input": text, "voice": "heart", "speed": 1.0, "seed": i,
                                                     "instructions": None}) for i in range(copies)]
        firsts, samples = [], 0
        lock = threading.Lock()

        def drain(job):
            nonlocal samples
            first = None
            while True:
                kind, payload = job.outbox.get(timeout=600)
                if kind != "audio":
                    break
                first = first or time.perf_counter() - start
                with lock:
                    samples += len(payload) // 2
            firsts.append(first)

        threads = [threading.Thread(target=drain, args=(job,)) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return statistics.median(firsts), time.perf_counter() - start, samples / RATE

    def close(self) -> None:
        self.registry.close()


def _hibari_worker(conn, threads: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from hibari import Hibari

    tts = Hibari(threads=threads)
    pool = ThreadPoolExecutor(8)
    while True:
        message = conn.recv()
        if message is None:
            return
        text, copies = message
        start = time.perf_counter()

        def one(seed):
            first, samples = None, 0
            for chunk in tts.stream(text, speed=1.0, seed=seed):
                first = first or time.perf_counter() - start
                samples += len(chunk)
            return first, samples

        results = list(pool.map(one, range(copies)))
        conn.send((statistics.median(r[0] for r in results), time.perf_counter() - start,
                   sum(r[1] for r in results) / RATE))


class Hibari:
    def __init__(self, threads: int):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_hibari_worker, args=(child, threads), daemon=True)
        self.process.start()

    def speak(self, text: str, copies: int) -> tuple[float, float, float]:
        self.conn.send((text, copies))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(30)

# One of these goes into every sentence of a repeat's text (`fresh`): words of 1-4 syllables
WORDS = ("red", "golden", "wild", "quiet", "enormous", "silver", "northern", "beautiful", "small", "wooden",
         "tired", "unusual", "green", "peaceful", "bright", "mysterious")


def fresh(text: str, repeat: int) -> str:
    """`text` with one adjective after the first "the"/"a" of each sentence (or in front of it),
    a different one for every (repeat, sentence)."""
    out = []
    for i, sentence in enumerate(text.replace(". ", ".|").replace("? ", "?|").split("|")):
        word = WORDS[(repeat * 5 + i) % len(WORDS)]
        words = sentence.split(" ")
        at = next((j + 1 for j, w in enumerate(words) if w.lower() in ("the", "a")), None)
        out.append(" ".join(words[:at] + [word] + words[at:]) if at is not None else f"{word.capitalize()}, {sentence[:1].lower()}{sentence[1:]}")
    return " ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    loom, hibari = Loom(), Hibari(args.threads)
    rows = []
    try:
        for name, text in (("short", SHORT), ("paragraph", PARAGRAPH)):
            for copies in (1, 4):
                loom.speak(text, copies)          # warm-up: compiles and loads every kernel
                hibari.speak(text, copies)
                runs: dict[str, list[tuple[float, float, float]]] = {"loom": [], "hibari": []}
                for repeat in range(args.repeats):
                    variant = fresh(text, repeat + 7 * copies)
                    time.sleep(0.3)               # let the other engine's threads go quiet
                    runs["loom"].append(loom.speak(variant, copies))
                    time.sleep(0.3)
                    runs["hibari"].append(hibari.speak(variant, copies))
                figures = {}
                for engine, results in runs.items():
                    first = statistics.median(r[0] for r in results)
                    rtf = statistics.median(r[2] / r[1] for r in results)
                    figures[engine] = (first, rtf)
                rows.append((f"{name} x {copies}", figures["loom"], figures["hibari"]))
    finally:
        loom.close()
        hibari.close()
    print(f"speaker (hibari af_heart), {args.threads} threads, median of {args.repeats}")
    print(f"machine: {describe()}")
    print(f"{'workload':<16} {'first audio ms':>24} {'audio s per s':>26}")
    print(f"{'':<16} {'Loom':>7} {'hibari':>7} {'ratio':>8} {'Loom':>8} {'hibari':>8} {'ratio':>8}")
    for name, (l_first, l_rtf), (h_first, h_rtf) in rows:
        print(f"{name:<16} {1000 * l_first:>7.0f} {1000 * h_first:>7.0f} {h_first / l_first:>7.2f}x "
              f"{l_rtf:>8.1f} {h_rtf:>8.1f} {l_rtf / h_rtf:>7.2f}x")
    print("(first-audio ratio: hibari's time over Loom's, so above 1 means Loom is sooner)")
    print(json.dumps({name: {"loom": {"first_ms": round(1000 * l[0]), "rtf": round(l[1], 1)},
                             "hibari": {"first_ms": round(1000 * h[0]), "rtf": round(h[1], 1)}}
                      for name, l, h in rows}))


if __name__ == "__main__":
    main()
