"""Retained-conversation benchmark: time to first token of a follow-up turn, reuse vs replay.

Run by hand (never in CI):  .venv/bin/python bench/retained.py [--history 1000] [--repeats 3]

A conversation of `--history` prompt tokens gets a 16-token answer; the follow-up sends the
whole history (prompt + answer) plus 24 new tokens, as a chat client does. Measured, with
the two cases interleaved (reuse, replay, reuse, replay, ...) on fresh conversations:

  reuse   the follow-up continues the idle row that still holds the history
          (`cached_tokens` = the history), so only the new suffix is prefilled;
  replay  an unrelated request takes the deployment's only row first, so the follow-up
          prefills everything but the few tokens that request shared.

Prints the medians and the ratio replay / reuse (how many times faster the first token
arrives with reuse), from one run on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loomrt.devices import Devices  # noqa: E402
from loomrt.registry import Registry  # noqa: E402
from loomrt.services.text import Generation, Sampling  # noqa: E402
from text import prompt_ids  # noqa: E402  (bench/text.py: fresh prompts, shared with that benchmark)

GREEDY = Sampling(temperature=0.0, top_p=1.0, top_k=0, seed=0)
ANSWER = 16
SUFFIX = 24


class Scout:
    def __init__(self, threads: int):
        os.environ.setdefault("NUMBA_NUM_THREADS", str(threads))
        self.registry = Registry(Devices(cuda={}))
        doc = json.loads((REPO / "samples" / "scout" / "model.json").read_text())
        # one row, no session or prefix cache: another request evicts the history, which is then replayed
        doc.update(rows=1, pool_capacity=4096, context_length=2048, session_cache_capacity=0, prefix_cache_capacity=0)
        self.reg = self.registry.register(json.dumps(doc), origin=str(REPO / "samples" / "scout" / "model.json"))
        if not self.registry.wait_for(lambda: self.reg.phase in ("ready", "failed"), 1200) or self.reg.phase != "ready":
            raise SystemExit(f"scout did not become ready: {self.reg.error}")
        self.tokenizer = self.reg.tokenizer
        self.state = self.reg.policy.prepare({"messages": [{"role": "user", "content": "Hi"}]}).state

    def ids(self, n: int) -> list[int]:
        return prompt_ids(self.tokenizer, n)

    def generate(self, prompt: list[int], max_tokens: int) -> Generation:
        gen = Generation(prompt, max_tokens, GREEDY, (), self.state)
        self.registry.submit(self.reg.name, gen)
        gen.future.result(3600)
        return gen

    def first_token(self, prompt: list[int]) -> tuple[float, int]:
        """Seconds until the first generated token of `prompt`, and the cached tokens it reused."""
        gen = Generation(prompt, 1, GREEDY, (), self.state)
        start = time.perf_counter()
        self.registry.submit(self.reg.name, gen)
        gen.future.result(3600)
        return time.perf_counter() - start, gen.cached_tokens

    def follow_up(self, history: int, evict: bool) -> tuple[float, int]:
        first = self.generate(self.ids(history), ANSWER)
        follow = first.prompt + first.generated + self.ids(SUFFIX)
        if evict:
            self.generate(self.ids(8), 1)
        return self.first_token(follow)

    def close(self) -> None:
        self.registry.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    scout = Scout(args.threads)
    try:
        scout.follow_up(64, evict=False)   # warm-up: loads every kernel
        reuse, replay, cached = [], [], {}
        for _ in range(args.repeats):
            seconds, cached["reuse"] = scout.follow_up(args.history, evict=False)
            reuse.append(seconds)
            seconds, cached["replay"] = scout.follow_up(args.history, evict=True)
            replay.append(seconds)
    finally:
        scout.close()
    total = args.history + ANSWER + SUFFIX
    print(f"follow-up of {total} tokens after a {args.history}-token history, {args.threads} threads, "
          f"median of {args.repeats}")
    print(f"{'case':<8} {'TTFT ms':>9} {'cached_tokens':>14}")
    print(f"{'reuse':<8} {statistics.median(reuse) * 1e3:>9.0f} {cached['reuse']:>14}")
    print(f"{'replay':<8} {statistics.median(replay) * 1e3:>9.0f} {cached['replay']:>14}")
    print(f"ratio replay / reuse: {statistics.median(replay) / statistics.median(reuse):.1f}x")


if __name__ == "__main__":
    main()
