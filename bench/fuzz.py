"""Fuzz a `loomd` by hand: seeded, structure-aware mutations of valid requests to every route.

    .venv/bin/python bench/fuzz.py --count 100000 --seed 1           # starts its own daemon
    .venv/bin/python bench/fuzz.py --count 5000 --url 127.0.0.1:8080  # a daemon already running
    .venv/bin/python bench/fuzz.py --replay fuzz-reproducers/1-42.bin --url 127.0.0.1:8080

The generator is `tests/conformance/http_fuzz.py` (the CI test `test_fuzz_http.py` runs a bounded
count of it). Against `--url`, the daemon should serve the deployments the cases name (`scout`,
`mini`, `spare`; others answer 404, which is fine). Prints counts by status ("closed": closed
without an answer, "hang": neither within `--deadline`), then every failure (status >= 500, hang,
an error body that is not OpenAI-style JSON), each saved as a reproducer in `--out`; exits 1 if any.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "conformance"))
sys.path.insert(0, str(REPO / "tests" / "unit" / "loomrt"))

import http_fuzz  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="first case number (to resume or re-run a range)")
    ap.add_argument("--url", help="HOST:PORT of a running loomd (default: start one)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--deadline", type=float, default=30.0, help="seconds a case may take before it counts as a hang")
    ap.add_argument("--out", type=Path, default=Path("fuzz-reproducers"))
    ap.add_argument("--replay", type=Path, help="send one saved .bin (half-closing after it) and print the answer")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="loom-fuzz-"))
    server = None
    if args.url:
        host, _, port = args.url.rpartition(":")
        host, port = host or "127.0.0.1", int(port)
    else:
        print("starting loomd (scout, mini, spare) ...", flush=True)
        server = http_fuzz.start_daemon(tmp)
        http_fuzz.warm_up(server)
        host, port = "127.0.0.1", server.port
    try:
        if args.replay:
            case = http_fuzz.Case("replay", "replay", "?", [args.replay.read_bytes()], half_close=True)
            print(http_fuzz.send(host, port, case, args.deadline))
            return 0
        case = http_fuzz.fuzz_inputs(tmp, args.seed, args.start + args.count)
        began = time.monotonic()
        summary = http_fuzz.campaign(
            host, port, case, args.count, start=args.start, workers=args.workers, deadline_s=args.deadline,
            progress=lambda n, s: print(f"{n:7d} cases, {time.monotonic() - began:6.0f} s: {s.line()}", flush=True))
        print(f"seed {args.seed}, cases {args.start}..{args.start + args.count - 1}, "
              f"{time.monotonic() - began:.0f} s")
        print("by status:", summary.line())
        print(f"answered after {http_fuzz.SLOW_S:.0f} s (slow, not failed): {summary.slow}")
        top = sorted(summary.closed_by.items(), key=lambda kv: -kv[1])[:15]
        print("closed without an answer, by mutation:", ", ".join(f"{k} {v}" for k, v in top))
        kinds = {"5xx": 0, "hang": 0, "bad error body": 0}
        for i, c, out in summary.failures:
            kinds["5xx"] += any(s >= 500 for s in out.statuses)
            kinds["hang"] += out.hung
            kinds["bad error body"] += bool(out.problems)
            path = http_fuzz.save_reproducer(args.out, args.seed, i, c, out)
            print(f"  case {i}: {c.family} {c.route} ({c.mutation}) statuses={out.statuses} hung={out.hung} "
                  f"{'; '.join(out.problems)[:200]} -> {path}")
        print("failures:", ", ".join(f"{k} {v}" for k, v in kinds.items()))
        if server is not None:
            server.assert_healthy()
            print("after the run: /healthz answers 200")
        return 1 if summary.failures else 0
    finally:
        if server is not None:
            code = server.stop()
            if code != 0:
                print("".join(server.output)[-3000:])


if __name__ == "__main__":
    sys.exit(main())
