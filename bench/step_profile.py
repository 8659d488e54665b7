"""Where a served decode step of scout spends its time, kernel by kernel.

Run by hand (not in CI):

    .venv/bin/python bench/step_profile.py                 # batch 1
    .venv/bin/python bench/step_profile.py --streams 8     # 8 concurrent rows

Registers scout in process as `bench/text.py` does, then times every kernel launch of
every stage call (`CommandProgram._run`'s loop, which runs on the kernel thread, reproduced
here with a clock around each call) while decoding on fresh prompts. Steps that carry a prompt chunk are much longer
than pure decode steps; only the fastest `--keep` share of the steps is summarised, which
at 32 decoded tokens per prompt leaves the decode steps. Prints each kernel's share of
the kernel time, its calls per step and its time per call.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from text import LoomText  # noqa: E402

from loomc.run import dispatch  # noqa: E402


def timed_run(steps: list[list[tuple[str, float]]]):
    """A `CommandProgram._run` that records (kernel, seconds) for every launch into `steps`,
    and as ("(host, between steps)", seconds) the time from the previous call's return to
    this call's first launch: the service's own work per step (packing, sampling results,
    `publish`, events), the hand-off to the kernel thread and back, and the plan's binding
    (`CommandProgram.prepare`)."""
    last_return = [None]

    def run(self, params, state, inputs):
        plan = self.prepare(params, state, inputs)
        prepared = time.perf_counter()
        record = [] if last_return[0] is None else [(HOST, prepared - last_return[0])]
        for fn, args in plan.calls:
            start = time.perf_counter()
            fn(*args)
            elapsed = time.perf_counter() - start   # before the name: a dispatcher's repr is not free
            record.append((kernel_name(fn), elapsed))
        steps.append(record)
        results = {name: buf.copy() for name, buf in plan.results.items()}
        last_return[0] = time.perf_counter()
        return results

    return run


HOST = "(host, between steps)"


def kernel_name(fn) -> str:
    """A launched function's name, for the tables."""
    return getattr(fn, "__name__", None) or repr(fn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=1, help="concurrent rows (default 1)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens decoded per prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=float, default=0.8, help="share of the fastest steps summarised")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--places", type=int, default=0,
                        help="also print the median of each of the step's first N calls by its place (a layer's calls "
                             "apart: one q/k/v projection from another) and of its last 8")
    args = parser.parse_args()
    engine = LoomText(args.threads)
    engine.decode(8, streams=args.streams)  # loads every kernel of both stages
    steps: list[list[tuple[str, float]]] = []
    dispatch.CommandProgram._run = timed_run(steps)
    for _ in range(args.repeats):
        engine.decode(args.tokens, streams=args.streams)
    engine.close()
    steps = [record for record in steps if record and record[0][0] == HOST and record[0][1] < 1.0]  # not across repeats
    fastest = fastest_steps(steps, args.keep)
    totals = kernel_totals(fastest)
    per_step = sum(t for t, _ in totals.values()) / len(fastest)
    host = totals[HOST][0] / len(fastest)
    print(f"{len(fastest)} of {len(steps)} steps, {args.streams} row(s), {args.threads} thread(s): "
          f"{per_step * 1e3:.2f} ms per step, {(per_step - host) * 1e3:.2f} ms of it in kernels")
    print(f"{'share':>6}  {'kernel':<24} {'calls/step':>10} {'us/call':>9}")
    for name, (seconds, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"{seconds / len(fastest) / per_step:6.1%}  {name.removeprefix('k_'):<24} "
              f"{calls / len(fastest):10.0f} {seconds / calls * 1e6:9.1f}")
    if args.places:
        print_places(fastest, args.places)


def fastest_steps(steps: list[list[tuple[str, float]]], keep: float) -> list[list[tuple[str, float]]]:
    """The fastest `keep` share of the recorded steps (at 32 decoded tokens a prompt, the decode steps)."""
    return sorted(steps, key=lambda record: sum(t for _, t in record))[:max(1, int(len(steps) * keep))]


def kernel_totals(steps: list[list[tuple[str, float]]]) -> dict[str, list[float]]:
    """Per kernel name (and HOST): [seconds, calls] summed over `steps`."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for record in steps:
        for name, seconds in record:
            totals[name][0] += seconds
            totals[name][1] += 1
    return totals


def print_places(steps: list[list[tuple[str, float]]], first: int) -> None:
    """The median of each call by its place in the step, over the steps with the most common
    number of calls (the pure decode steps)."""
    calls = collections.Counter(len(record) for record in steps).most_common(1)[0][0]
    same = [record for record in steps if len(record) == calls]
    places = [*range(min(first, calls)), *range(max(first, calls - 8), calls)]
    print(f"\n{'place':>5}  {'call':<24} {'us':>9}   (median of {len(same)} steps of {calls} calls)")
    for i in places:
        print(f"{i:5d}  {same[0][i][0].removeprefix('k_'):<24} {statistics.median(r[i][1] for r in same) * 1e6:9.1f}")


if __name__ == "__main__":
    main()
