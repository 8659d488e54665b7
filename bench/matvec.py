"""Quantized matmul kernels as generated now against the same kernels from another commit's compiler.

Run by hand (not in CI):

    .venv/bin/python bench/matvec.py                 # this tree against HEAD's loomc
    .venv/bin/python bench/matvec.py --ref HEAD~3 --rounds 5 --only q4_1

The baseline is the `loomc/` (and, for commits before the grammar moved into `loomc/grammar/`, the
top-level `grammar/`) of `--ref`, extracted with `git archive` into a temporary
folder (nothing in the repository changes); each variant runs in its own process, and
the processes alternate for `--rounds` rounds, so both see the same machine load. Each
line gives the best time over all rounds of both variants, the GB/s of the weights
(GGUF bytes, the stream a decode step is bound by) at that time, and speed = baseline
time / this tree's time.

Cases: scout's shapes at T = 1 (decode) and T = 4..128 (prefill) with the weights hot in
cache, and `stream`: scout's 210 Q4_1 matvecs of one decode step, each on its own copy of
the weights (66 MB, more than the last-level cache), which is what decode really runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (label, qtype, N, K, T)
CASES = [
    ("q4_1 1536x576 T=1", "q4_1", 1536, 576, 1),
    ("q4_1 576x1536 T=1", "q4_1", 576, 1536, 1),
    ("q4_1 576x576 T=1", "q4_1", 576, 576, 1),
    ("q8_0 49152x576 T=1 (LM head)", "q8_0", 49152, 576, 1),
    ("q4_0 1536x576 T=1", "q4_0", 1536, 576, 1),
    ("q4_1 1536x576 T=4", "q4_1", 1536, 576, 4),
    ("q4_1 1536x576 T=8 (8 decode streams)", "q4_1", 1536, 576, 8),
    ("q4_1 1536x576 T=16", "q4_1", 1536, 576, 16),
    ("q4_1 1536x576 T=128", "q4_1", 1536, 576, 128),
    ("q8_0 1536x576 T=16", "q8_0", 1536, 576, 16),
]
# one decode step's Q4_1 projections of scout: (N, K) x count per layer, 30 layers
STEP = [((576, 576), 2), ((192, 576), 2), ((1536, 576), 2), ((576, 1536), 1)]
LAYERS = 30


def worker(only: str | None, reps: int) -> None:
    """Time every case with the `loomc` first on sys.path; print one JSON object."""
    import numpy as np

    sys.path.insert(1, str(REPO / "tests" / "numerics"))
    from numerics_testlib import quantized

    from loomc.check import load_files
    from loomc.run.compile import compile_kernel

    motifs = load_files(sorted((REPO / "loomc" / "motifs").glob("*.loom")))
    kernels: dict = {}
    rng = np.random.default_rng(0)
    results: dict[str, list[float]] = {}

    def kernel(name):
        if name not in kernels:
            kernels[name] = compile_kernel(motifs, name)
        return kernels[name]

    def best(fn) -> float:
        fn()
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.min(times))

    for label, qtype, n, k, t_count in CASES:
        if only and only not in label:
            continue
        blocks, _ = quantized(rng, qtype, n, k)
        x = rng.standard_normal((t_count, k)).astype(np.float32)
        y = np.zeros((t_count, n), np.float32)
        launcher = kernel(f"matmul_{qtype}")
        bound = launcher.bind(x, blocks, y)
        results[label] = [best(lambda: launcher.launch(bound)), blocks.nbytes, float(np.abs(y).sum())]
    if not only or only in "stream q4_1":
        launcher = kernel("matmul_q4_1")
        calls = []
        nbytes = 0
        for _ in range(LAYERS):
            for (n, k), count in STEP:
                for _ in range(count):
                    blocks, _ = quantized(rng, "q4_1", n, k)
                    x = rng.standard_normal((1, k)).astype(np.float32)
                    calls.append(launcher.bind(x, blocks, np.zeros((1, n), np.float32)))
                    nbytes += blocks.nbytes

        def step():
            for bound in calls:
                launcher.launch(bound)

        results["stream: one decode step's 210 q4_1 matvecs"] = [best(step), nbytes, 0.0]
    print(json.dumps(results))


def run_worker(root: Path, only: str | None, reps: int, threads: int | None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(REPO)]))
    if threads:
        env["NUMBA_NUM_THREADS"] = str(threads)
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--reps", str(reps)]
    if only:
        command += ["--only", only]
    done = subprocess.run(command, env=env, cwd=str(REPO), capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"worker for {root} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", default="HEAD", help="git commit whose loomc is the baseline (default HEAD)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both variants")
    parser.add_argument("--reps", type=int, default=50, help="timed calls per case per round")
    parser.add_argument("--only", help="only cases whose label contains this")
    parser.add_argument("--threads", type=int, help="NUMBA_NUM_THREADS for both variants (1 measures the code "
                        "per core and is far less disturbed by other load on a shared machine)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.only, args.reps)
        return
    with tempfile.TemporaryDirectory(prefix="loom_bench_ref_") as tmp:
        # Older commits read the grammar from a top-level grammar/ (newer ones: loomc/grammar/).
        old_grammar = subprocess.run(["git", "cat-file", "-e", f"{args.ref}:grammar"], cwd=REPO,
                                     capture_output=True).returncode == 0
        archive = subprocess.run(["git", "archive", "--format=tar", args.ref, "loomc",
                                  *(["grammar"] if old_grammar else [])], cwd=REPO,
                                 capture_output=True, check=True).stdout
        tar_path = Path(tmp) / "ref.tar"
        tar_path.write_bytes(archive)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
        best: dict[str, dict[str, list]] = {"ref": {}, "new": {}}
        for r in range(args.rounds):
            for variant, root in (("ref", Path(tmp)), ("new", REPO)):
                for label, (t, nbytes, check) in run_worker(root, args.only, args.reps, args.threads).items():
                    old = best[variant].get(label)
                    if old is None or t < old[0]:
                        best[variant][label] = [t, nbytes, check]
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    import numba

    threads = args.threads or numba.config.NUMBA_NUM_THREADS
    print(f"{os.cpu_count()} cpus, numba {numba.__version__}, {threads} thread(s); "
          f"baseline = loomc at {args.ref}; best of {args.rounds} rounds x {args.reps} calls")
    print(f"{'case':<46} {'baseline':>20} {'this tree':>20}  speed")
    for label, (t_new, nbytes, check_new) in best["new"].items():
        t_ref, _, check_ref = best["ref"][label]
        same = "" if abs(check_new - check_ref) <= 1e-4 * max(1.0, abs(check_ref)) else "  (outputs differ!)"
        print(f"{label:<46} {t_ref * 1e6:9.1f} us {nbytes / t_ref / 1e9:5.2f} GB/s "
              f"{t_new * 1e6:9.1f} us {nbytes / t_new / 1e9:5.2f} GB/s  {t_ref / t_new:5.2f}x{same}")


if __name__ == "__main__":
    main()
