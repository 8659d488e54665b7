"""Motif kernels on realistic shapes against numpy/BLAS on the same shapes, printed as ratios.

Run by hand (not in CI):  .venv/bin/python bench/motifs.py [--reps N] [--only NAME]

Each line: the kernel's best time (its median in parentheses: this 2-vCPU VM stalls
sleeping threads for milliseconds now and then), GFLOP/s and GB/s at the best time (bytes
of its operands, weights in their GGUF storage), the numpy baseline's best time, and
`speed` = baseline time / kernel time (above 1: the kernel is faster). Matmul baselines are float32 BLAS on the
*dequantized* weight (dequantization not timed), so they read 5-8x more bytes than the
kernel. The last section measures a command program's per-dispatch overhead.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "numerics"))

from machine import describe  # noqa: E402  (bench/machine.py)
from numerics_testlib import dequantized, quantized  # noqa: E402

from loomc.check import load_files  # noqa: E402
from loomc.run.compile import compile_command, compile_kernel  # noqa: E402


def timings(fn, reps: int) -> tuple[float, float]:
    """(best, median) seconds of `reps` calls after two warm-up calls."""
    time.sleep(0.2)  # let the other pool's spinning threads (OpenBLAS, OpenMP) go idle first
    fn()
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.min(times)), float(np.median(times))


def alternated_best(fns, reps: int, rounds: int) -> list[float]:
    """Each of `fns`'s best seconds over `rounds` rounds of `timings`, the fns alternating
    within each round so that all see the same machine load."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        best = [min(b, timings(fn, reps)[0]) for b, fn in zip(best, fns)]
    return best


class Bench:
    def __init__(self, reps: int, only: str | None):
        self.reps = reps
        self.only = only
        self.motifs = load_files(sorted((REPO / "loomc" / "motifs").glob("*.loom")))
        self.kernels = {}
        self.rng = np.random.default_rng(0)

    def kernel(self, name):
        if name not in self.kernels:
            self.kernels[name] = compile_kernel(self.motifs, name)
        return self.kernels[name]

    def case(self, label: str, name: str, args: tuple, flops: float, nbytes: float, baseline) -> None:
        if self.only and self.only not in label:
            return
        launcher = self.kernel(name)
        bound = launcher.bind(*args)
        t, t50 = timings(lambda: launcher.launch(bound), self.reps)
        tb, _ = timings(baseline, self.reps)
        print(f"{label:<38} {t * 1e6:8.1f} us ({t50 * 1e6:8.1f}) {flops / t / 1e9:6.2f} GFLOP/s {nbytes / t / 1e9:6.2f} GB/s"
              f" | numpy {tb * 1e6:8.1f} us {flops / tb / 1e9:6.2f} GFLOP/s | speed {tb / t:5.2f}x", flush=True)

    def matmuls(self) -> None:
        for qtype, (n, k) in (("q4_1", (1536, 576)), ("q4_1", (576, 1536)), ("q8_0", (1536, 576)),
                              ("q4_0", (1536, 576)), ("q8_0", (49152, 576))):
            blocks, w = quantized(self.rng, qtype, n, k)
            wt = np.ascontiguousarray(w.T)
            for t_count in (1, 8, 64):
                if n > 10000 and t_count > 8:
                    continue
                x = self.rng.standard_normal((t_count, k)).astype(np.float32)
                y = np.zeros((t_count, n), np.float32)
                self.case(f"matmul_{qtype} {n}x{k} T={t_count}", f"matmul_{qtype}", (x, blocks, y),
                          2 * t_count * n * k, blocks.nbytes + x.nbytes + y.nbytes,
                          lambda x=x, wt=wt: np.matmul(x, wt))

    def gemm(self) -> None:
        """The matmul motifs (the compiler's GEMM, loomc/lower/matmul.py) against BLAS sgemm."""
        from loomc.lower.matmul import load_function, workspace_elems

        for motif in ("matmul", "matmul_f16"):
            gemm = load_function(motif)
            for m, k, n in ((16, 384, 1152), (512, 384, 1152), (512, 384, 1536), (512, 1536, 384)):
                label = f"{motif} {m}x{k} . {n}x{k}^T"
                if self.only and self.only not in label:
                    continue
                a = self.rng.standard_normal((1, m, k)).astype(np.float32)
                b = self.rng.standard_normal((1, n, k)).astype(np.float32)
                weights = b if motif == "matmul" else b.astype(np.float16).view(np.uint16)
                c, pack = np.zeros((1, m, n), np.float32), np.zeros(workspace_elems(motif, 1, m, k, n), np.float32)
                t, t50 = timings(lambda: gemm(a, weights, c, pack), self.reps)
                tb, _ = timings(lambda: np.matmul(a[0], b[0].T, out=c[0]), self.reps)
                flops = 2 * m * n * k
                print(f"{label:<38} {t * 1e6:8.1f} us ({t50 * 1e6:8.1f}) {flops / t / 1e9:6.2f} GFLOP/s"
                      f" | BLAS {tb * 1e6:8.1f} us {flops / tb / 1e9:6.2f} GFLOP/s | speed {tb / t:5.2f}x", flush=True)

    def elementwise(self) -> None:
        for t_count, d in ((1, 576), (64, 576)):
            x = self.rng.standard_normal((t_count, d)).astype(np.float32)
            w = self.rng.standard_normal(d).astype(np.float32)
            y = np.zeros_like(x)
            self.case(f"rmsnorm T={t_count} D={d}", "rmsnorm", (x, w, np.float32(1e-5), y), 4 * t_count * d,
                      x.nbytes * 2 + w.nbytes,
                      lambda x=x, w=w: x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-5) * w)
        for t_count in (1, 64):
            g = self.rng.standard_normal((t_count, 1536)).astype(np.float32)
            u = self.rng.standard_normal((t_count, 1536)).astype(np.float32)
            y = np.zeros_like(g)
            self.case(f"swiglu T={t_count} F=1536", "swiglu", (g, u, y), 5 * g.size, 3 * g.nbytes,
                      lambda g=g, u=u: g / (1 + np.exp(-g)) * u)
        x = self.rng.standard_normal((64, 576)).astype(np.float32)
        pos = np.arange(64, dtype=np.int32)
        hd = 64
        theta = pos[:, None] * 100000.0 ** (-2.0 * np.arange(hd // 2) / hd)
        c, s = np.cos(theta).astype(np.float32)[:, None, :], np.sin(theta).astype(np.float32)[:, None, :]

        def rope_numpy(x=x):
            v = x.reshape(64, 9, hd // 2, 2)
            a, b = v[..., 0], v[..., 1]
            return np.stack([a * c - b * s, a * s + b * c], axis=-1)

        self.case("rope_interleaved T=64 heads=9 hd=64", "rope_interleaved", (x, pos, 9, np.float32(100000.0)),
                  6 * x.size // 2, 2 * x.nbytes, rope_numpy)
        blocks, table = quantized(self.rng, "q8_0", 49152, 576)
        ids = self.rng.integers(0, 49152, 64).astype(np.int32)
        y = np.zeros((64, 576), np.float32)
        self.case("embed_q8_0 T=64 V=49152 D=576", "embed_q8_0", (blocks, ids, y), 64 * 576,
                  64 * 612 + y.nbytes, lambda: table[ids])

    def attention(self) -> None:
        heads, kv_heads, hd, page = 9, 3, 64, 16
        for rows_count, decode, ctx in ((1, True, 256), (4, True, 256), (8, True, 256), (1, False, 256), (1, False, 512)):
            pages_per_row = ctx // page
            num_pages = rows_count * pages_per_row
            k_cache = self.rng.standard_normal((num_pages, 1, page, kv_heads * hd)).astype(np.float32)
            v_cache = self.rng.standard_normal((num_pages, 1, page, kv_heads * hd)).astype(np.float32)
            table = self.rng.permutation(num_pages).astype(np.int32).reshape(rows_count, pages_per_row)
            if decode:
                rows = np.arange(rows_count, dtype=np.int32)
                positions = np.full(rows_count, ctx - 1, np.int32)
            else:
                rows = np.zeros(ctx, np.int32)
                positions = np.arange(ctx, dtype=np.int32)
            t_count = len(rows)
            q = self.rng.standard_normal((t_count, heads * hd)).astype(np.float32)
            o = np.zeros_like(q)
            keys_per_token = positions + 1
            flops = float(4 * hd * heads * keys_per_token.sum())
            nbytes = float(2 * keys_per_token.sum() * kv_heads * hd * 4)  # keys and values each token reads
            dense_k = k_cache[table].reshape(rows_count, ctx, kv_heads, hd)
            dense_v = v_cache[table].reshape(rows_count, ctx, kv_heads, hd)

            def numpy_attention(q=q, rows=rows, positions=positions, dense_k=dense_k, dense_v=dense_v):
                qh = q.reshape(len(rows), kv_heads, heads // kv_heads, hd)
                out = np.empty_like(qh)
                for r in np.unique(rows):
                    sel = np.nonzero(rows == r)[0]
                    kk, vv = dense_k[r].transpose(1, 0, 2), dense_v[r].transpose(1, 0, 2)  # [g, ctx, hd]
                    s = np.einsum("tgjd,gcd->tgjc", qh[sel], kk) / np.float32(np.sqrt(hd))
                    s = np.where(np.arange(ctx)[None, None, None, :] <= positions[sel][:, None, None, None], s, -np.inf)
                    w = np.exp(s - s.max(axis=-1, keepdims=True))
                    w /= w.sum(axis=-1, keepdims=True)
                    out[sel] = np.einsum("tgjc,gcd->tgjd", w, vv)
                return out

            label = f"paged_attention ctx={ctx} {'decode R=' + str(rows_count) if decode else 'prefill T=' + str(ctx)}"
            args = (q, rows, positions, table, k_cache, v_cache, 0, heads, kv_heads, np.float32(1 / np.sqrt(hd)), o)
            self.case(label, "paged_attention", args, flops, nbytes, numpy_attention)
            self.motif_case("attention_paged" + label[len("paged_attention"):], "attention_paged", args, flops, nbytes,
                            numpy_attention)

    def motif_case(self, label: str, motif: str, args: tuple, flops: float, nbytes: float, baseline) -> None:
        """`case` for a compiler motif (loomc/lower/motifs.py), called with its dispatch's arguments."""
        from loomc.lower.motifs import lowering_of

        if self.only and self.only not in label:
            return
        lowering = lowering_of(motif)
        fn = lowering.load_function(motif)
        launch = lowering.launch_arguments(motif, list(args), np.zeros(0, np.float32))
        t, t50 = timings(lambda: fn(*launch), self.reps)
        tb, _ = timings(baseline, self.reps)
        print(f"{label:<38} {t * 1e6:8.1f} us ({t50 * 1e6:8.1f}) {flops / t / 1e9:6.2f} GFLOP/s {nbytes / t / 1e9:6.2f} GB/s"
              f" | numpy {tb * 1e6:8.1f} us {flops / tb / 1e9:6.2f} GFLOP/s | speed {tb / t:5.2f}x", flush=True)

    def sampling(self) -> None:
        rows_count, vocab = 4, 49152
        logits = (self.rng.standard_normal((rows_count, vocab)) * 3).astype(np.float32)
        args = (logits, np.full(rows_count, 0.8, np.float32), np.full(rows_count, 0.9, np.float32),
                np.zeros(rows_count, np.int32), np.arange(rows_count, dtype=np.uint64),
                np.zeros(rows_count, np.uint64), np.zeros_like(logits), np.zeros(rows_count, np.int32))

        def numpy_top_p():
            p = np.exp((logits - logits.max(axis=1, keepdims=True)) / 0.8)
            order = np.argsort(-p, axis=1)
            sp = np.take_along_axis(p, order, axis=1)
            c = np.cumsum(sp, axis=1)
            keep = c - sp < 0.9 * c[:, -1:]
            return (keep * sp).sum(axis=1)

        self.case(f"sample top_p=0.9 R={rows_count} V={vocab}", "sample", args, 45 * logits.size, logits.nbytes * 2,
                  numpy_top_p)
        out = np.zeros(rows_count, np.int32)
        self.case(f"argmax R={rows_count} V={vocab}", "argmax", (logits, out), logits.size, logits.nbytes,
                  lambda: logits.argmax(axis=1))

    def dispatch_overhead(self, count: int = 1000) -> None:
        if self.only and self.only not in "dispatch":
            return
        source = ("kernel touch(inout x: f32[N]) {\n    parallel for i in 0..N {\n        x[i] = x[i] + 1.0\n    }\n}\n\n"
                  "command many(x: f32[N]) -> (y: f32[N]) {\n    for l in 0.." + str(count) + " {\n        touch(y)\n"
                  "    }\n}\n")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "overhead.loom"
            path.write_text(source)
            checked = load_files([path])
            program = compile_command(checked, "many")
            touch = compile_kernel(checked, "touch")
        inputs = {"x": np.zeros(1, np.float32)}
        t, _ = timings(lambda: program.run({}, {}, inputs), max(5, self.reps // 10))
        y = np.zeros(1, np.float32)
        bound = touch.bind(y)
        fn = touch.functions[0]
        t_call, _ = timings(lambda: [fn(*bound) for _ in range(count)], max(5, self.reps // 10))
        t_np, _ = timings(lambda: [np.add(y, 1.0, out=y) for _ in range(count)], max(5, self.reps // 10))
        print(f"{'command program, ' + str(count) + ' dispatches of a 1-element kernel':<38} "
              f"{t / count * 1e6:9.2f} us per dispatch (a direct numba call: {t_call / count * 1e6:.2f} us; "
              f"np.add on 1 element: {t_np / count * 1e6:.2f} us)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--only", help="run only cases whose label contains this text")
    args = parser.parse_args()
    import numba

    print(f"numba {numba.__version__}, numpy {np.__version__}, {os.cpu_count()} cpus, "
          f"threading layer {numba.config.THREADING_LAYER!r} ({numba.config.NUMBA_NUM_THREADS} threads), "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}",
          flush=True)
    print(f"machine: {describe()}", flush=True)
    bench = Bench(args.reps, args.only)
    bench.gemm()
    bench.matmuls()
    bench.elementwise()
    bench.attention()
    bench.sampling()
    bench.dispatch_overhead()
    import numba

    print(f"(threading layer used: {numba.threading_layer()})")


if __name__ == "__main__":
    main()
