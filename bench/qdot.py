"""The integer-dot motifs against std:quant.loom's f32 kernels, on scout's shapes, as ratios.

Run by hand (not in CI):

    .venv/bin/python bench/qdot.py [--rounds 3] [--reps 100] [--threads 2]

`matmul_q4_1_i16` / `matmul_q8_0_i16` (loomc/lower/qdot.py: activations quantized to 16-bit
codes, integer dot products) against `matmul_q4_1` / `matmul_q8_0` (std:quant.loom: every
weight dequantized, f32 products) on the same GGUF blocks and inputs, in one process, the two
alternating for `--rounds` rounds so both see the same machine load. Each line: both best
times, the speed (f32 time / integer-dot time), the integer-dot kernel's GFLOP/s and the GB/s
of its weights. `stream` runs one decode step's 210 q4_1 projections, each on its own copy of
the weights (66 MB, more than the last-level cache), which is what a decode step really reads.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "numerics"))

# (label, qtype, N, K, T)
CASES = [
    ("q4_1 1536x576 T=1", "q4_1", 1536, 576, 1),
    ("q4_1 576x1536 T=1", "q4_1", 576, 1536, 1),
    ("q4_1 576x576 T=1", "q4_1", 576, 576, 1),
    ("q8_0 49152x576 T=1 (LM head)", "q8_0", 49152, 576, 1),
    ("q4_1 1536x576 T=8 (8 decode streams)", "q4_1", 1536, 576, 8),
    ("q8_0 49152x576 T=8 (LM head, 8 streams)", "q8_0", 49152, 576, 8),
    ("q4_1 1536x576 T=128 (prefill)", "q4_1", 1536, 576, 128),
    ("q4_1 576x1536 T=512 (prefill)", "q4_1", 576, 1536, 512),
]
STEP = [((576, 576), 2), ((192, 576), 2), ((1536, 576), 2), ((576, 1536), 1)]   # scout's per layer
LAYERS = 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=100, help="timed calls per case per round (fewer for big cases)")
    parser.add_argument("--threads", type=int, help="NUMBA_NUM_THREADS")
    args = parser.parse_args()
    if args.threads:
        os.environ["NUMBA_NUM_THREADS"] = str(args.threads)

    import numpy as np

    from machine import describe
    from motifs import alternated_best
    from numerics_testlib import quantized

    from loomc.check import load_files
    from loomc.lower import qdot
    from loomc.run.compile import compile_kernel

    motifs = load_files(sorted((REPO / "loomc" / "motifs").glob("*.loom")))
    rng = np.random.default_rng(0)

    def pair(qtype: str, shapes: list[tuple[int, int, int]]):
        """(f32 step, integer-dot step, weight bytes, flops) over the given (N, K, T) calls."""
        f32_kernel = compile_kernel(motifs, f"matmul_{qtype}")
        motif = qdot.load_function(f"matmul_{qtype}_i16")
        f32_calls, int_calls, nbytes, flops = [], [], 0, 0
        for n, k, t in shapes:
            blocks, _ = quantized(rng, qtype, n, k)
            x = rng.standard_normal((t, k)).astype(np.float32)
            f32_calls.append(f32_kernel.bind(x, blocks, np.zeros((t, n), np.float32)))
            int_calls.append((x, blocks, np.zeros((t, n), np.float32), np.zeros(qdot.workspace_elems(t, k), np.float32)))
            nbytes += blocks.nbytes
            flops += 2 * n * k * t

        def f32_step():
            for bound in f32_calls:
                f32_kernel.launch(bound)

        def int_step():
            for call in int_calls:
                motif(*call)

        return f32_step, int_step, nbytes, flops

    print(describe())
    print(f"threads: {os.environ.get('NUMBA_NUM_THREADS', 'all')}")
    cases = [(label, qtype, [(n, k, t)]) for label, qtype, n, k, t in CASES]
    cases.append(("stream: one decode step's 210 q4_1 projections", "q4_1",
                  [(n, k, 1) for _ in range(LAYERS) for (n, k), count in STEP for _ in range(count)]))
    print(f"{'case':48} {'f32 kernel':>12} {'integer dot':>12} {'speed':>7} {'GFLOP/s':>8} {'GB/s':>6}")
    for label, qtype, shapes in cases:
        f32_step, int_step, nbytes, flops = pair(qtype, shapes)
        work = sum(n * k * t for n, k, t in shapes)
        reps = max(3, min(args.reps, int(args.reps * 2e7 / work)))
        f32_best, int_best = alternated_best([f32_step, int_step], reps, args.rounds)
        print(f"{label:48} {f32_best * 1e6:10.1f}us {int_best * 1e6:10.1f}us {f32_best / int_best:6.2f}x "
              f"{flops / int_best / 1e9:8.1f} {nbytes / int_best / 1e9:6.1f}")


if __name__ == "__main__":
    main()
