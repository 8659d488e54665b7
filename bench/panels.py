"""Quantized weights in 16-row panels against plain rows, through the integer-dot motifs, as ratios.

Run by hand (not in CI):

    .venv/bin/python bench/panels.py [--dtype q4_1x16|q8_0x16] [--rounds 4] [--reps 100] [--threads 2]

The motif of `--dtype` (`matmul_q4_1x16_i16` by default) on blocks `repack`ed into its panels
against the plain-row motif on the same blocks in GGUF row order (`matmul_q4_1_i16`;
loomc/lower/qdot.py), in one process, alternating for `--rounds` rounds so both see the same
machine load. The two contracts round differently: the largest difference between them,
relative to the output's largest magnitude, is printed per case.
Cases for q4_1x16: scout's four fused projections per layer (wqkv 960 x 576, wo 576 x 576,
w_gate_up 3072 x 576, w_down 576 x 1536) with the weights hot in cache, at T = 1 (decode), 8
(eight streams) and 128 (prefill), and `stream`: one decode step's 120 projections, each on its
own copy of the weights (66 MB, more than the last-level cache), which is what decode reads.
For q8_0x16: scout's LM head (49152 x 576, 30 MB) at T = 1 and 8, read from memory as in decode.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "numerics"))

SHAPES = [("wqkv", 960, 576), ("wo", 576, 576), ("w_gate_up", 3072, 576), ("w_down", 576, 1536)]   # scout, per layer
LAYERS = 30
HEAD = ("lm_head", 49152, 576)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--reps", type=int, default=100, help="timed calls per case per round (fewer for big cases)")
    parser.add_argument("--threads", type=int, help="NUMBA_NUM_THREADS")
    parser.add_argument("--dtype", default="q4_1x16", choices=["q4_1x16", "q8_0x16"])
    args = parser.parse_args()
    if args.threads:
        os.environ["NUMBA_NUM_THREADS"] = str(args.threads)

    import numpy as np

    from machine import describe
    from motifs import alternated_best
    from numerics_testlib import quantized

    from loomc.dtypes import DTYPES
    from loomc.lower import qdot
    from loomrt.prepare import panel_order

    rng = np.random.default_rng(0)
    plain_type = DTYPES[args.dtype].panel_of
    motif_of = {dtype: motif for motif, dtype in qdot.MOTIFS.items() if motif not in qdot.AHEAD}
    plain_motif, panel_motif = qdot.load_function(motif_of[plain_type]), qdot.load_function(motif_of[args.dtype])

    def calls(shapes: list[tuple[int, int, int]]):
        """(plain calls, panel calls, weight bytes): one (x, w, y, workspace) per (N, K, T)."""
        plain, panel, nbytes = [], [], 0
        for n, k, t in shapes:
            blocks, _ = quantized(rng, plain_type, n, k)
            x = rng.standard_normal((t, k)).astype(np.float32)
            workspace = np.zeros(qdot.workspace_elems(t, k), np.float32)
            plain.append((x, blocks, np.zeros((t, n), np.float32), workspace))
            panel.append((x, panel_order(blocks, args.dtype), np.zeros((t, n), np.float32), workspace))
            nbytes += blocks.nbytes
        return plain, panel, nbytes

    def step(motif, bound):
        def run():
            for call in bound:
                motif(*call)
        return run

    print(describe())
    print(f"threads: {os.environ.get('NUMBA_NUM_THREADS', 'all')}")
    if plain_type == "q4_1":
        cases = [(f"{name} {n}x{k} T={t}", [(n, k, t)]) for t in (1, 8, 128) for name, n, k in SHAPES]
        cases.append(("stream: one decode step's 120 projections", [(n, k, 1) for _ in range(LAYERS) for _, n, k in SHAPES]))
    else:
        cases = [(f"{HEAD[0]} {HEAD[1]}x{HEAD[2]} T={t}", [(HEAD[1], HEAD[2], t)]) for t in (1, 8)]
    print(f"{'case':44} {plain_type:>12} {args.dtype:>12} {'speed':>7} {'GB/s':>6} {'diff':>8}")
    for label, shapes in cases:
        plain, panel, nbytes = calls(shapes)
        plain_step, panel_step = step(plain_motif, plain), step(panel_motif, panel)
        plain_step()
        panel_step()
        diff = max(float(np.abs(a[2] - b[2]).max() / np.abs(a[2]).max()) for a, b in zip(plain, panel))
        work = sum(n * k * t for n, k, t in shapes)
        reps = max(3, min(args.reps, int(args.reps * 2e7 / work)))
        plain_best, panel_best = alternated_best([plain_step, panel_step], reps, args.rounds)
        print(f"{label:44} {plain_best * 1e6:10.1f}us {panel_best * 1e6:10.1f}us {plain_best / panel_best:6.2f}x "
              f"{nbytes / panel_best / 1e9:6.1f} {diff:8.1e}")


if __name__ == "__main__":
    main()
