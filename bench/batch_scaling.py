"""How far 8 streams can get above batch 1: the served steps, and the same calls as fast as in cache.

Run by hand (not in CI):

    .venv/bin/python bench/batch_scaling.py [--streams 8] [--tokens 32] [--repeats 3] [--reps 30]

Issue 22 asks for 8 concurrent streams at >= 4x Loom's own batch 1, so for an 8-row decode
step of at most twice a batch-1 step. In one process this measures:
  served   the decode steps (one token a row) of scout at batch 1 and at `--streams` rows,
           kernel by kernel, as bench/step_profile.py times them (the fastest `--keep` share);
  in order the same step's calls run `--reps` times in step order with no host work between
           (each call's median): what the kernels take, their weights from memory, without
           what serving adds between steps;
  in cache one decode step's calls at each row count, each run `--reps` times back to back on
           its own arguments (so its weights, keys and activations are in cache): the median
           of each call, summed by kernel.
A call cannot run faster with its operands in memory than in cache, so the in-cache sum plus
the served host time is a lower bound on the step with these kernels. It prints the budget
that 4x asks for and the ratio that bound allows. Repeating a call changes the values of the
residual stream it adds to (they stay finite); the engine is closed after, nothing is served
from that state.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe  # noqa: E402
from step_profile import HOST, fastest_steps, kernel_name, kernel_totals, timed_run  # noqa: E402
from text import LoomText  # noqa: E402

from loomc.run import dispatch  # noqa: E402
from loomc.run.kernel_thread import on_kernel_thread  # noqa: E402

GOAL = 4.0


def served_profile(engine: LoomText, rows: int, tokens: int, repeats: int, keep: float,
                   captured: dict[int, list]) -> dict[str, tuple[float, float]]:
    """Per kernel name (and HOST): (seconds per step, calls per step) over the fastest steps;
    the calls of one pure decode step at `rows` rows go into `captured[rows]`."""
    steps: list[list[tuple[str, float]]] = []
    decode: list[list[tuple[str, float]]] = []   # the steps of one token a row, at `rows` rows
    run = timed_run(steps)

    def recording(self, params, state, inputs):
        out = run(self, params, state, inputs)
        if inputs["tokens"].size == inputs["last"].size == rows:   # one token a row: a decode step
            decode.append(steps[-1])
            if rows not in captured:
                plan = self.prepare(params, state, inputs)   # the same ShapePlan: its calls and buffers
                captured[rows] = list(plan.calls)
        return out

    dispatch.CommandProgram._run = recording
    for _ in range(repeats):
        engine.decode(tokens, streams=rows)
    decode = [s for s in decode if s[0][0] == HOST and s[0][1] < 1.0]   # not across repeats
    fastest = fastest_steps(decode, keep)
    totals = kernel_totals(fastest)
    return {name: (seconds / len(fastest), count / len(fastest)) for name, (seconds, count) in totals.items()}


def in_order(calls: list, reps: int) -> dict[str, float]:
    """Per kernel name: seconds per step, the step's calls run in order `reps` times with no host
    work between (each call's median): the weights stream from memory as served."""
    def measure() -> list[list[float]]:
        times: list[list[float]] = [[] for _ in calls]
        for _ in range(reps):
            for spent, (fn, args) in zip(times, calls):
                start = time.perf_counter()
                fn(*args)
                spent.append(time.perf_counter() - start)
        return times
    return by_kernel(calls, on_kernel_thread(measure))


def in_cache(calls: list, reps: int) -> dict[str, float]:
    """Per kernel name: seconds per step, each call at the median of `reps` back-to-back runs."""
    def measure() -> list[list[float]]:
        times: list[list[float]] = []
        for fn, args in calls:
            fn(*args)
            spent = []
            for _ in range(reps):
                start = time.perf_counter()
                fn(*args)
                spent.append(time.perf_counter() - start)
            times.append(spent)
        return times
    return by_kernel(calls, on_kernel_thread(measure))


def by_kernel(calls: list, times: list[list[float]]) -> dict[str, float]:
    """Each call's median seconds, summed by kernel name."""
    out: dict[str, float] = collections.defaultdict(float)
    for (fn, _), spent in zip(calls, times):
        out[kernel_name(fn)] += statistics.median(spent)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="tokens decoded per prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=float, default=0.8, help="share of the fastest steps summarised")
    parser.add_argument("--reps", type=int, default=30, help="runs of the step in order, and back-to-back runs of each call in cache")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(describe())
    engine = LoomText(args.threads)
    original = dispatch.CommandProgram._run
    captured: dict[int, list] = {}
    served = {}
    try:
        for rows in (1, args.streams):
            engine.decode(8, streams=rows)   # every kernel of both stages loaded
            served[rows] = served_profile(engine, rows, args.tokens, args.repeats, args.keep, captured)
            dispatch.CommandProgram._run = original
        ordered = {rows: in_order(captured[rows], args.reps) for rows in (1, args.streams)}
        cached = {rows: in_cache(captured[rows], args.reps) for rows in (1, args.streams)}
    finally:
        dispatch.CommandProgram._run = original
        engine.close()

    def step(rows: int) -> tuple[float, float]:
        total = sum(seconds for seconds, _ in served[rows].values())
        return total, served[rows][HOST][0]

    (one, one_host), (many, many_host) = step(1), step(args.streams)
    budget = args.streams * one / GOAL
    bound = sum(cached[args.streams].values()) + many_host
    print(f"\nserved: batch 1 {one * 1e3:.2f} ms a step (host {one_host * 1e3:.2f}), {args.streams} rows "
          f"{many * 1e3:.2f} ms (host {many_host * 1e3:.2f}): {args.streams} streams = "
          f"{args.streams * one / many:.2f}x batch 1")
    print(f"{GOAL:g}x batch 1 needs the {args.streams}-row step at <= {budget * 1e3:.2f} ms")
    print(f"every call as fast as in cache, the host as served: {args.streams} rows {bound * 1e3:.2f} ms "
          f"-> at most {args.streams * one / bound:.2f}x batch 1 (batch 1 itself in cache: "
          f"{(sum(cached[1].values()) + one_host) * 1e3:.2f} ms)")
    print(f"kernels alone, in step order (no host between steps): batch 1 {sum(ordered[1].values()) * 1e3:.2f} ms, "
          f"{args.streams} rows {sum(ordered[args.streams].values()) * 1e3:.2f} ms")
    print(f"\n{'kernel':<28} {'calls':>5} {'served':>8} {'order':>8} {'cache':>8} | {'served':>8} {'order':>8} {'cache':>8}"
          f"   (us a step: batch 1 | {args.streams} rows)")
    names = sorted(set(served[args.streams]) | {HOST}, key=lambda n: -served[args.streams].get(n, (0, 0))[0])
    for name in names:
        row = []
        for rows in (1, args.streams):
            host = served[rows][HOST][0]
            row += [served[rows].get(name, (0.0, 0))[0], ordered[rows].get(name, 0.0) if name != HOST else host,
                    cached[rows].get(name, 0.0) if name != HOST else host]
        print(f"{name.removeprefix('k_'):<28} {served[args.streams].get(name, (0, 0))[1]:5.0f} "
              + " ".join(f"{v * 1e6:8.1f}" for v in row[:3]) + " | " + " ".join(f"{v * 1e6:8.1f}" for v in row[3:]))


if __name__ == "__main__":
    main()
