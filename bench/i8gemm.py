"""The int8 matmul motif against the f32 matmul motif, on the speaker's shapes, as ratios.

Run by hand (not in CI):

    .venv/bin/python bench/i8gemm.py [--rounds 3] [--reps 30] [--threads 2]

`matmul_i8` (loomc/lower/i8gemm.py: activations quantized per row to uint8, int8 weights
packed in panels, integer dots) against `matmul` (loomc/lower/matmul.py: f32 on the same
weights dequantized) on the same inputs, in one process, the two alternating for `--rounds`
rounds so both see the same machine load. Each line: both best times, the speed (f32 time /
int8 time) and the int8 motif's GOP/s. To time another SIMD class's code on this CPU, set
NUMBA_CPU_NAME and NUMBA_CPU_FEATURES (tests/numerics/numerics_testlib.py has AVX2's) and a
NUMBA_CACHE_DIR of its own.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "numerics"))

# (M, K, N): the speaker's acoustic decoder (about 200 frames), its head, its text encoders (about 40 phonemes)
CASES = [(200, 256, 768), (200, 768, 256), (200, 256, 3005), (40, 192, 384), (40, 384, 192), (40, 192, 576),
         (100, 384, 192), (1, 768, 256)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=30, help="timed calls per case per round")
    parser.add_argument("--threads", type=int, help="NUMBA_NUM_THREADS")
    args = parser.parse_args()
    if args.threads:
        os.environ["NUMBA_NUM_THREADS"] = str(args.threads)

    import numpy as np

    from machine import describe
    from motifs import alternated_best
    from test_i8gemm_motif import pack

    from loomc.lower import i8gemm, matmul

    int8 = i8gemm.load_function()
    f32 = matmul.load_function("matmul")
    rng = np.random.default_rng(0)
    print(describe())
    print(f"threads: {os.environ.get('NUMBA_NUM_THREADS', 'all')}; int8 tile {i8gemm.tile_shape()}")
    print(f"{'M x K . N':20} {'f32 motif':>12} {'matmul_i8':>12} {'speed':>7} {'GOP/s':>7}")
    for m, k, n in CASES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
        scale = np.array([0.01], np.float32)
        c = np.zeros((m, n), np.float32)
        int_args = (a, pack(w), scale, c, np.zeros(i8gemm.workspace_elems(m, k, n), np.float32))
        f32_args = (a[None], (w.astype(np.float32) * scale[0])[None], c[None],
                    np.zeros(max(1, matmul.workspace_elems("matmul", 1, m, k, n)), np.float32))
        f32_best, int_best = alternated_best([lambda: f32(*f32_args), lambda: int8(*int_args)],
                                             args.reps, args.rounds)
        print(f"{f'{m} x {k} . {n}':20} {f32_best * 1e6:10.1f}us {int_best * 1e6:10.1f}us {f32_best / int_best:6.2f}x "
              f"{2 * m * k * n / int_best / 1e9:7.1f}")


if __name__ == "__main__":
    main()
