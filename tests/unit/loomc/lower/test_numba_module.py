"""Generated numba modules: headers, content-addressed files written atomically, `loomc emit`."""

import re
from pathlib import Path


import numpy as np
from click.testing import CliRunner

from loomc.check import load_files
from loomc.cli import main
from loomc.ir import interpret
from loomc.lower.kernels import lower_kernel
from loomc.lower.numba import default_cache_dir, load_group, module_path, render_module

SOURCE = ("config bias: f32 = 0.25\n\n// adds a bias\nkernel shift(x: f32[N], out y: f32[N]) {\n"
          "    parallel for i in 0..N {\n        y[i] = x[i] + bias\n    }\n}\n")


def group(tmp_path):
    path = tmp_path / "shift.loom"
    path.write_text(SOURCE)
    checked = load_files([path])
    info = checked.modules[0]
    return lower_kernel(checked.core, info, info.decls["shift"])


def test_module_text_names_its_source_and_is_self_contained(tmp_path):
    text = render_module(group(tmp_path))
    assert re.search(r"^# kernel shift: .*shift\.loom:4$", text, re.M)
    assert "# configs: bias = 0.25" in text
    assert '@njit(parallel=True, cache=True, fastmath=False, error_model="numpy")' in text
    assert "prange(" in text and "np.float32(0.25)" in text
    imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
    assert all(re.match(r"(import (math|numpy as np)|from numba[\w.]* import )", line) for line in imports)
    compile(text, "generated", "exec")


def test_files_are_content_addressed_and_written_once(tmp_path):
    g = group(tmp_path)
    cache = tmp_path / "cache"
    (fn,) = load_group(g, cache)
    path = module_path(render_module(g), cache)
    assert path.parent == cache / "kernels" and re.fullmatch(r"k_[0-9a-f]{16}\.py", path.name)
    assert path.read_text() == render_module(g)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp_")]
    stamp = path.stat().st_mtime_ns
    (again,) = load_group(g, cache)
    assert again is fn and path.stat().st_mtime_ns == stamp  # numba's cache index keys on the file's stamp


def test_cache_dir_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOM_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("LOOM_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "loom"


def test_emit_prints_the_cached_module_texts(repo):
    result = CliRunner().invoke(main, ["emit", "--target", "cpu", str(repo / "samples" / "scout" / "model.json")])
    assert result.exit_code == 0, result.output
    headers = re.findall(r"^# kernel (\w+): (\S+):(\d+)$", result.output, re.M)
    assert ("matmul_q4_1", "loomc/motifs/quant.loom", "24") in headers
    assert {"sample", "paged_attention", "rmsnorm", "embed_q8_0"} <= {h[0] for h in headers}
    assert result.output.count("@njit(parallel=True, cache=True, fastmath=False") >= len(headers)


def test_emit_filters_kernels_and_prints_ir(repo):
    motifs = str(repo / "loomc" / "motifs")
    result = CliRunner().invoke(main, ["emit", "--ir", "--kernel", "argmax", motifs])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("// loomc/motifs/sampling.loom:")
    assert "kernel argmax(logits: f32[R, V], out next: i32[R])" in result.output
    missing = CliRunner().invoke(main, ["emit", "--kernel", "nope", motifs])
    assert missing.exit_code == 1 and "no kernel named nope" in missing.output


def test_emit_reports_diagnostics_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.loom"
    bad.write_text("kernel k(x: f32[N]) {\n    parallel for i in 0..N {\n        x[i] = 1.0\n    }\n}\n")
    result = CliRunner().invoke(main, ["emit", str(bad)])
    assert result.exit_code == 1 and "L0305" in result.output and "Traceback" not in result.output


ROW_SUMS = ("kernel row_sums(x: f32[R, K], out y: f32[R]) {\n    parallel for r in 0..R {\n"
            "        var acc: f32 = 0.0\n        for k in 0..K {\n            acc += x[r, k]\n        }\n"
            "        y[r] = acc\n    }\n}\n")
NOT_A_TREE = ("kernel shifted(x: f32[N], out y: f32[N]) {\n    parallel for i in 0..N {\n"
              "        var a: f32[8]\n        for j in 0..8 { a[j] = x[i] + f32(j) }\n"
              "        for z in 0..4 { a[z] = a[z] + a[z + 3] }\n        y[i] = a[0] + a[3]\n    }\n}\n")


def lowered(tmp_path, source: str, name: str):
    path = tmp_path / f"{name}.loom"
    path.write_text(source)
    checked = load_files([path])
    assert checked.ok, [d.message for d in checked.diagnostics]
    info = checked.modules[0]
    return lower_kernel(checked.core, info, info.decls[name])


def lanes_then_tree(row: np.ndarray) -> np.float32:
    """The lanes pass's order (lanes.py), in f32 numpy: lane z sums elements z, z + 32, ...
    in order, then the lanes are added as a pairwise tree."""
    lanes = np.zeros(32, np.float32)
    for k, value in enumerate(row):
        lanes[k % 32] = np.float32(lanes[k % 32] + value)
    width = 16
    while width:
        lanes[:width] = lanes[:width] + lanes[width:2 * width]
        width //= 2
    return np.float32(np.float32(0) + lanes[0])


def test_tree_levels_run_as_vector_folds_with_the_same_sums(tmp_path):
    g = lowered(tmp_path, ROW_SUMS, "row_sums")
    text = render_module(g)
    folds = [int(w) for w in re.findall(r"_lm_fold\(v_acc_lanes, (\d+)\)", text)]
    assert folds and folds == [16, 8, 4, 2, 1] * (len(folds) // 5)  # in the serial and the parallel form
    (fn,) = load_group(g, tmp_path / "cache")
    rng = np.random.default_rng(7)
    for k in (1, 31, 32, 100, 576):
        x = (rng.standard_normal((5, k)) * 10.0 ** rng.integers(-3, 4, (5, k))).astype(np.float32)
        y = np.zeros(5, np.float32)
        fn(x.reshape(-1), y, k, 5)
        assert y.tobytes() == np.array([lanes_then_tree(row) for row in x], np.float32).tobytes()


def test_other_loops_over_local_arrays_stay_loops(tmp_path):
    g = lowered(tmp_path, NOT_A_TREE, "shifted")
    assert "_lm_fold" not in render_module(g)
    (fn,) = load_group(g, tmp_path / "cache")
    x = np.arange(4, dtype=np.float32)
    y = np.zeros(4, np.float32)
    fn(x, y, 4)
    a = x[:, None] + np.arange(8, dtype=np.float32)
    for z in range(4):  # in order: a[3] is updated before a[0 + 3] is read again
        a[:, z] = a[:, z] + a[:, z + 3]
    assert y.tolist() == (a[:, 0] + a[:, 3]).tolist()


HEAVY = """kernel scaled_rows(x: f32[R, D], out y: f32[R, D]) {
    parallel for r in 0..R {
        for d in 0..D {
            y[r, d] = x[r, d] * 2.0
        }
        for h in 0..2 {
            for d in 0..D / 2 {
                y[r, h * (D / 2) + d] += 1.0
            }
        }
        for d in 0..r {
            y[r, 0] += 0.0
        }
    }
}
"""


def test_a_heavy_parallel_loop_of_little_known_work_runs_serially(tmp_path):
    from loomc.lower.numba import SERIAL_HEAVY_WORK

    g = lowered(tmp_path, HEAVY, "scaled_rows")
    text = render_module(g)
    # the lanes times their loops whose bounds are known before the loop starts (D, 2 x D / 2;
    # not 0..r, which depends on the lane)
    (condition,) = re.findall(rf"if \((_n\d+) <= 1 or \1 \* \((.*)\) <= {SERIAL_HEAVY_WORK}\):", text)
    assert condition[1].count("v_D") == 2 and "v_r" not in condition[1]
    (fn,) = load_group(g, tmp_path / "cache")
    for rows, d in ((3, 8), (64, 1024)):   # below and above SERIAL_HEAVY_WORK: each lane the same either way
        x = np.arange(rows * d, dtype=np.float32).reshape(rows, d)
        y = np.zeros_like(x)
        fn(x.reshape(-1), y.reshape(-1), d, rows)   # symbols in name order
        np.testing.assert_array_equal(y, x * 2 + 1)


LIGHT = """kernel biased_rows(x: f32[R, D], out y: f32[R, D]) {
    parallel for r in 0..R, d in 0..D {
        y[r, d] = x[r, d] * 2.0 + 1.0
    }
}
"""


def test_a_light_parallel_loop_of_few_chunks_runs_serially(tmp_path):
    from loomc.lower.numba import LIGHT_CHUNK, SERIAL_LIGHT_CHUNKS

    g = lowered(tmp_path, LIGHT, "biased_rows")
    text = render_module(g)
    # rows times the chunks of LIGHT_CHUNK elements of a row, against the serial bound
    (rows, chunks) = re.findall(rf"if (_n\d+) \* (_c\d+) <= {SERIAL_LIGHT_CHUNKS}:", text)[0]
    assert re.search(rf"{chunks} = \(_n\d+ \+ {LIGHT_CHUNK - 1}\) // {LIGHT_CHUNK}", text)
    (fn,) = load_group(g, tmp_path / "cache")
    serial_rows = SERIAL_LIGHT_CHUNKS * LIGHT_CHUNK // 576
    for r in (serial_rows, serial_rows + 1):   # 576 features: the last serial row count and the first parallel one
        x = np.arange(r * 576, dtype=np.float32).reshape(r, 576) / 7
        y = np.zeros_like(x)
        fn(x.reshape(-1), y.reshape(-1), 576, r)   # symbols in name order
        np.testing.assert_array_equal(y, x * np.float32(2) + np.float32(1))


HALVES = """kernel halves(x: f32[N], out h: f16[N], out b: bf16[N], out s: f16[N]) {
    parallel for i in 0..N {
        h[i] = f16(x[i])
        b[i] = bf16(x[i])
        s[i] = f16(x[i]) + f16(1.0)
    }
}
"""


def test_a_stored_conversion_to_a_half_type_is_narrowed_once(tmp_path):
    # the bits of a value rounded to f16 (bf16) are the bits of the value: a store takes
    # them straight from the f32, not back and forth through the rounded value; the operands
    # of a sum are still rounded before it
    g = lowered(tmp_path, HALVES, "halves")
    text = render_module(g)
    assert "_lm_f16_bits(np.float32(" in text and "_lm_bf16_bits(np.float32(" in text
    assert "_lm_f16_bits(_lm_round_f16(np.float32(" not in text
    (sum_store,) = [line for line in text.splitlines() if "v_s[" in line and "=" in line][:1]
    assert "_lm_round_f16(np.float32(v_x" in sum_store   # the operand is rounded before the sum
    (fn,) = load_group(g, tmp_path / "cache")
    x = np.array([0.1, -65519.99, 65520.0, 1e-8, 6e-8, 2.0 ** -24 * 1.5, np.inf, -np.inf, np.nan,
                  np.float32(1 + 2 ** -11), -0.0], np.float32)
    x = np.concatenate([x, np.uint32([0x7F800001, 0xFFC01234]).view(np.float32)])   # NaNs with payloads
    h, b, s = (np.zeros(x.size, np.uint16) for _ in range(3))
    fn(x, h, b, s, x.size)
    np.testing.assert_array_equal(h, [interpret._bitcast(interpret._cast(float(v), "f32", "f16"), "f16", "u16") for v in x])
    np.testing.assert_array_equal(b, [interpret._bitcast(interpret._cast(float(v), "f32", "bf16"), "bf16", "u16") for v in x])
    one = interpret._cast(1.0, "f32", "f16")
    np.testing.assert_array_equal(s, [interpret._bitcast(interpret._cast(interpret._cast(float(v), "f32", "f16") + one, "f32", "f16"),
                                                         "f16", "u16") for v in x])
