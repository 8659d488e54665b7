"""The attention motif on the cpu target: scores, softmax and values without writing the scores out.

    attention(q: f32[G, M, E], k: f32[G, N, E], vt: f32[G, E, N], scale: f32, out o: f32[G, M, E])

o is, bit for bit, what `bmm(q, k, s)`, std:seq2seq.loom's `softmax_scaled(s, scale)` and
`bmm(s, vt, o)` compute: every score the matmul motif's one fma chain over e from +0.0, the
softmax of `s * scale` with softmax_scaled's own operations in its order (the maximum, Cephes'
polynomial exp clamped at -87, the 32-lane sum and its fixed pairwise fold, one reciprocal),
then every output element one fma chain over n from +0.0. Only where the scores live changes:
the unfused calls wrote G x M x N floats (the recognizer's encoder, 12 x 1500 x 1500: 108 MB
per layer), which the softmax read and wrote again and the second `bmm` read once more; here a
task's 16 rows of scores (16 N floats) stay in its core's L2 from the first product to the last.

How it runs: the matmul motif's swapped tile (`loomc/lower/matmul.py`). k and vt are packed
once per call into 16-row panels, the vector sides; a task takes (group, 16 rows of q), runs the
score tiles with q's rows read in place as the broadcast side (the last partial block from a
zero-padded copy) storing 16 rows of scores side by side, softmaxes each row in place and runs
the output tiles with those rows as the broadcast side, in slices of k that stay in L1.
Limit (the dispatcher checks it, with the shapes): E <= MAX_HEAD_DIM.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loomc import LOOMC_VERSION
from loomc.lower import matmul

MOTIFS = {"attention"}
MAX_HEAD_DIM = 256   # features per head: a task's output accumulators (16 rows of them) live on its stack


def workspace_elems(groups: int, rows: int, keys: int, head_dim: int) -> int:
    """f32 elements of the workspace one call wants: k packed in panels of 16 keys, vt packed in
    panels of 16 features, then a zero-padded copy of each group's last partial block of q."""
    mr, nr = matmul.PANEL_ROWS, matmul.TILE_COLS
    packed_k = groups * -(-keys // mr) * head_dim * mr
    packed_v = groups * -(-head_dim // mr) * keys * mr
    return packed_k + packed_v + (groups * nr * head_dim if rows % nr else 0)


_DRIVER = '''
@njit(parallel=True, cache=True, fastmath=False, error_model="numpy")
def k_attention(q, k, vt, o, scale, ws):
    # o[g] = softmax_scaled(q[g] . k[g]^T, scale) . vt[g]^T, 16 rows of q per task
    G, M, E = q.shape
    N = k.shape[1]
    scale = np.float32(scale)
    kpan = (N + MR - 1) // MR
    vpan = (E + MR - 1) // MR
    qblocks = (M + NR - 1) // NR
    packed_k = G * kpan * E * MR
    packed_v = G * vpan * N * MR
    if ws.size < packed_k + packed_v + (G * NR * E if M % NR else 0):
        raise ValueError("attention: workspace smaller than workspace_elems")
    for gp in prange(G * kpan):
        _lm_pack_rows(k, gp // kpan, gp % kpan, ws, gp * E * MR)
    for gp in prange(G * vpan):
        _lm_pack_rows(vt, gp // vpan, gp % vpan, ws, packed_k + gp * N * MR)
    if M % NR:
        for g in range(G):
            _lm_pad_rows(q, g, (qblocks - 1) * NR, ws, packed_k + packed_v + g * NR * E)
    q_flat = q.reshape(-1)
    kc = min(N, KC)
    slices = (N + kc - 1) // max(kc, 1)
    for task in prange(G * qblocks):
        g = task // qblocks
        m0 = (task - g * qblocks) * NR
        rows = min(NR, M - m0)
        if m0 + NR <= M:
            src = q_flat
            off = (g * M + m0) * E
        else:
            src = ws
            off = packed_k + packed_v + g * NR * E
        # the scores of the task's rows, s[j * NP + n] = q[m0 + j] . k[n] (rows padded to whole
        # panels; rows past M score zero-padded queries): each tile stores its 16 x 16 block in place
        NP = kpan * MR
        s = np.empty(NR * NP, np.float32)
        for i in range(NR * NP):
            s[i] = np.float32(0.0)
        for p in range(kpan):
            _lm_gemm_tile(ws, (g * kpan + p) * E * MR, src, off, E, E, s[p * MR:], NP)
        # each row softmaxed in place with softmax_scaled's operations
        for j in range(rows):
            _lm_softmax_row(s, j * NP, N, scale)
        # o's rows: one fma chain over n per element, in slices of n shared by the panels of vt
        acc = carray(_lm_alloca(ACC_ELEMS, np.float32), (ACC_ELEMS,))
        for i in range(vpan * NR * MR):
            acc[i] = np.float32(0.0)
        for t in range(slices):
            k0 = t * kc
            kn = min(kc, N - k0)
            for p in range(vpan):
                _lm_gemm_tile(ws, packed_k + ((g * vpan + p) * N + k0) * MR, s, k0, NP, kn, acc[p * NR * MR:], MR)
        for p in range(vpan):
            for j in range(rows):
                for i in range(min(MR, E - p * MR)):
                    o[g, m0 + j, p * MR + i] = acc[(p * NR + j) * MR + i]
'''


SOFTMAX_ROW_SOURCE = '''
@njit(cache=True, fastmath=False, error_model="numpy")
def _lm_softmax_row(s, row, N, scale):
    # s[row + n] = softmax_scaled's value of s[row + n] * scale over n < N, its operations in its order
    part = carray(_lm_alloca(16, np.float32), (16,))
    for z in range(16):
        part[z] = np.float32(-3.0000000054977558e+38)
    for c in range(N // 16):
        for z in range(16):
            part[z] = _lm_max(part[z], s[np.uint64(row + c * 16 + z)] * scale)
    top = np.float32(-3.0000000054977558e+38)
    for n in range(N // 16 * 16, N):
        top = _lm_max(top, s[np.uint64(row + n)] * scale)
    for z in range(16):
        top = _lm_max(top, part[z])
    for n in range(N):
        x = _lm_max(s[np.uint64(row + n)] * scale - top, np.float32(-87.0))
        kk = np.floor(x * np.float32(1.4426950216293335) + np.float32(0.5))
        r = _lm_fma(kk, np.float32(-0.693359375), x)
        r = _lm_fma(kk, np.float32(0.00021219444170128554), r)
        e = np.float32(0.00019875691214110702)
        e = _lm_fma(e, r, np.float32(0.001398199936375022))
        e = _lm_fma(e, r, np.float32(0.008333452045917511))
        e = _lm_fma(e, r, np.float32(0.04166579619050026))
        e = _lm_fma(e, r, np.float32(0.1666666567325592))
        e = _lm_fma(e, r, np.float32(0.5))
        s[np.uint64(row + n)] = (_lm_fma(e, r * r, r) + np.float32(1.0)) * np.int32(np.int32((np.int32((np.int32(kk) + np.int32(127))) << np.int32(23)))).view(np.float32)
    lanes = carray(_lm_alloca(32, np.float32), (32,))
    for z in range(32):
        lanes[z] = np.float32(0)
    for n0 in range(0, N, 32):
        for l in range(min(16, N - n0)):
            lanes[l] = lanes[l] + s[np.uint64(row + n0 + l)]
        for l in range(min(16, N - n0 - 16)):
            lanes[16 + l] = lanes[16 + l] + s[np.uint64(row + n0 + 16 + l)]
    _lm_fold(lanes, 16)
    _lm_fold(lanes, 8)
    _lm_fold(lanes, 4)
    _lm_fold(lanes, 2)
    _lm_fold(lanes, 1)
    total = np.float32(0.0) + lanes[0]
    inv = np.float32(1.0) / total
    for n in range(N):
        s[np.uint64(row + n)] = s[np.uint64(row + n)] * inv
'''


def function_name(motif: str = "attention") -> str:
    return f"k_{motif}"


def render_module(motif: str = "attention") -> str:
    """The generated numba module of the motif, written to the kernel cache like every kernel."""
    import numba

    from loomc.lower.numba_helpers import IMPORTS, helpers_for

    header = (f"# Generated by loomc {LOOMC_VERSION} for numba {numba.__version__}; do not edit.\n"
              f"# motif {motif}: o = bmm(softmax_scaled(bmm(q, k), scale), vt) without the scores "
              f"(loomc/lower/attention.py), tile {matmul.PANEL_ROWS} x {matmul.TILE_COLS}\n")
    constants = f"MR = {matmul.PANEL_ROWS}\nNR = {matmul.TILE_COLS}\nUNROLL = {matmul.UNROLL}\nKC = {matmul.K_SLICE}\n"
    acc = -(-MAX_HEAD_DIM // matmul.PANEL_ROWS) * matmul.TILE_COLS * matmul.PANEL_ROWS
    driver = _DRIVER.replace("ACC_ELEMS", str(acc)).replace("NR * MR", str(matmul.PANEL_ROWS * matmul.TILE_COLS))
    copies = matmul.pack_source("_lm_pack_rows", "f32") + matmul.PAD_SOURCE
    helpers = "".join(h + "\n\n" for h in helpers_for(driver + copies + SOFTMAX_ROW_SOURCE))
    return header + IMPORTS + "\n" + constants + "\n" + helpers + matmul.TILE_SOURCE + copies + SOFTMAX_ROW_SOURCE + "\n" + driver


def workspace_for(motif: str, q_dims: list[int], k_dims: list[int], vt_dims: list[int], o_dims: list[int]) -> int:
    """`workspace_elems` from the operands' dimensions, as a command dispatches them."""
    groups, rows, head_dim = q_dims
    return workspace_elems(groups, rows, k_dims[1], head_dim)


def launch_arguments(motif: str, values: list, workspace: np.ndarray) -> tuple:
    """The driver's arguments for a dispatch's operands, after the check the motif's signature
    cannot make (the head size against MAX_HEAD_DIM); ValueError when it fails."""
    q, k, vt, scale, o = values
    if q.shape[2] > MAX_HEAD_DIM:
        raise ValueError(f"heads of {q.shape[2]} features; the motif takes at most {MAX_HEAD_DIM}")
    return q, k, vt, o, float(scale), workspace


def argument_examples(motif: str = "attention") -> tuple:
    """One value of each argument's exact type as dispatch passes them, for compiling ahead."""
    z = np.zeros((1, 1, 1), np.float32)
    return z, z.copy(), z.copy(), z.copy(), 1.0, np.zeros(1, np.float32)


def load_function(motif: str = "attention", cache_dir: Path | None = None):
    """The compiled (lazily, then cached on disk) numba dispatcher: it takes
    (q, k, vt, o, scale, workspace)."""
    from loomc.lower.numba import ensure_module, load_module, module_path

    text = render_module(motif)
    path = module_path(text, cache_dir)
    ensure_module(path, text)
    return getattr(load_module(path), function_name(motif))
