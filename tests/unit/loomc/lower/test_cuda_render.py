"""The CUDA renderer: module text, launch plans, `loomc emit --target cuda`, and nvcc on every kernel.

No GPU is needed. The drift test at the end compiles the renderer's scalar code (the same
expression table and helpers that kernels use) for the host and compares a table of edge
cases with `loomc.ir.interpret`, the reference the numba renderer is tested against too."""

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from loomc.check import load_files
from loomc.cli import main
from loomc.ir import interpret
from loomc.ir import module as ir
from loomc.lower import cuda
from loomc.lower.kernels import lower_kernel
from loomc.syntax import ast
from loomc.syntax.parse import parse_module

REPO = Path(__file__).resolve().parents[4]
NVCC = shutil.which("nvcc")
CXX = shutil.which("g++") or shutil.which("c++")


def groups_of(path: Path) -> dict[str, ir.KernelGroup]:
    """The lowered kernels defined in one `.loom` file (checked with whatever it uses)."""
    checked = load_files([path])
    assert checked.ok, checked.diagnostics
    info = next(m for m in checked.modules if Path(m.path).resolve() == path.resolve())
    return {item.name: lower_kernel(checked.core, info, item)
            for item in info.module.items if isinstance(item, ast.Kernel)}


def source(tmp_path, text: str) -> dict[str, ir.KernelGroup]:
    path = tmp_path / "k.loom"
    path.write_text(text)
    return groups_of(path)


SHIFT = ("config bias: f32 = 0.25\n\n// adds a bias\nkernel shift(x: f32[N], out y: f32[N]) {\n"
         "    parallel for i in 0..N {\n        y[i] = x[i] + bias\n    }\n}\n")


def test_module_text_names_its_sources_and_needs_no_headers(tmp_path):
    text = cuda.render_module(source(tmp_path, SHIFT)).text
    assert re.search(r"^// kernel shift: .*k\.loom:4 -> k_shift$", text, re.M)
    assert re.search(r"^// kernel shift: .*k\.loom:4$", text, re.M)  # above the function itself
    assert "// configs: bias = 0.25" in text
    assert 'extern "C" __global__ void k_shift(const float* v_x, float* v_y, long long v_N)' in text
    assert "0.25f" in text and "#include" not in text
    assert "--fmad=false" in text and "--fmad=false" in cuda.COMPILE_OPTIONS


def test_two_dimensional_loop_maps_to_one_flat_grid_stride_index(tmp_path):
    groups = source(tmp_path, "kernel scale(x: f32[T, D], out y: f32[T, D]) {\n"
                              "    parallel for t in 0..T, d in 0..D {\n        y[t, d] = x[t, d] * 2.0\n    }\n}\n")
    module = cuda.render_module(groups)
    (plan,) = module.launches["scale"]
    assert plan.function == "k_scale" and plan.block_threads == cuda.BLOCK_THREADS
    assert plan.extents == ((ir.Const("i64", 0), ir.Ref("T", "i64")), (ir.Const("i64", 0), ir.Ref("D", "i64")))
    assert plan.lanes({"T": 3, "D": 1000}) == 3000
    assert plan.grid_blocks({"T": 3, "D": 1000}) == -(-3000 // cuda.BLOCK_THREADS)
    assert plan.grid_blocks({"T": 0, "D": 1000}) == 0  # nothing to launch
    assert plan.grid_blocks({"T": 1 << 20, "D": 1 << 12}) == cuda.MAX_BLOCKS  # the grid-stride loop does the rest
    body = module.text[module.text.index("k_scale("):]
    # the flat index walks the last lane fastest (coalesced row-major stores)
    assert "p += (long long)gridDim.x * blockDim.x" in body.replace("lm_p4", "p")
    assert re.search(r"const long long v_d = lm_p\d+ % lm_n\d+;", body)
    assert re.search(r"const long long v_t = lm_r\d+;", body)


def test_lane_bounds_from_scalars_and_from_device_memory(tmp_path):
    groups = source(tmp_path, """\
kernel first(x: f32[N], n: i32, out y: f32[N]) {
    parallel for i in 1..n {
        y[i] = x[i]
    }
}

kernel counted(lens: i32[1], out y: f32[N]) {
    let n = i64(lens[0])
    parallel for i in 0..n {
        y[i] = 1.0
    }
}
""")
    module = cuda.render_module(groups)
    (first,) = module.launches["first"]
    assert first.lanes({"n": 11, "N": 20}) == 10 and first.lanes({"n": -4, "N": 20}) == 0
    (counted,) = module.launches["counted"]
    assert counted.extents is None and counted.grid_blocks({"N": 5}) == cuda.FALLBACK_BLOCKS


def test_single_lane_parts_run_on_one_thread_in_order(tmp_path):
    groups = source(tmp_path, """\
kernel phases(x: f32[N], out y: f32[N], out total: f32[1]) {
    parallel for i in 0..N {
        y[i] = x[i]
    }
    var acc: f32 = 0.0
    for i in 0..N {
        acc += y[i]
    }
    total[0] = acc
}
""")
    module = cuda.render_module(groups)
    loop, serial = module.launches["phases"]
    assert (loop.function, serial.function) == ("k_phases", "k_phases__1")
    assert serial.block_threads == 1 and serial.extents == () and serial.grid_blocks({"N": 9}) == 1
    assert "if (blockIdx.x == 0 && threadIdx.x == 0) {" in module.text
    assert "(parallel loop 2 of 2, launched in order)" in module.text


def test_wrapping_integer_ops_compute_in_unsigned_types(tmp_path):
    groups = source(tmp_path, """\
kernel wraps(a: i32[N], b: u16[N], c: u32[N], out x: i32[N], out y: u16[N], out z: u32[N]) {
    parallel for i in 0..N {
        x[i] = a[i] * a[i] + (a[i] << 3) - (-a[i])
        y[i] = b[i] * b[i]
        z[i] = c[i] * c[i] + c[i]
    }
}
""")
    text = cuda.render_module(groups).text
    assert "lm_mul_i32(" in text and "lm_add_i32(" in text and "lm_shl_i32(" in text and "lm_neg_i32(" in text
    assert "LM_FN int lm_mul_i32(int a, int b) { return (int)((unsigned int)a * (unsigned int)b); }" in text
    # u16 * u16 would promote to signed int and overflow: it multiplies as unsigned int
    assert "(unsigned short)((unsigned int)a * (unsigned int)b)" in text
    assert "((v_c[v_i] * v_c[v_i]) + v_c[v_i])" in text  # u32 wraps in C already


def test_quantized_reads_use_the_gguf_block_layout(tmp_path):
    text = cuda.render_module(groups_of(REPO / "loomc" / "motifs" / "quant.loom")).text
    assert "const unsigned char* v_w" in text
    assert re.search(r"lm_half_at\(v_w, .*18LL\)", text)  # q4_0 blocks are 18 bytes
    assert re.search(r"lm_q8\(v_w, .*34LL\)", text)
    assert "lm_f16_from_bits((unsigned int)w[offset] | ((unsigned int)w[offset + 1] << 8))" in text


def test_kernels_of_one_name_from_two_files_get_distinct_functions(tmp_path):
    (group,) = source(tmp_path, SHIFT).values()
    module = cuda.render_module({"a.loom:shift": group, "b.loom:shift": group})
    assert [p.function for p in module.launches["a.loom:shift"]] == ["k_shift"]
    assert [p.function for p in module.launches["b.loom:shift"]] == ["k_shift_2"]
    assert 'void k_shift_2(' in module.text


def test_emit_prints_one_cuda_module(repo):
    result = CliRunner().invoke(main, ["emit", "--target", "cuda", str(repo / "loomc" / "motifs" / "quant.loom"),
                                       "--kernel", "embed_f32", "--kernel", "matmul_q8_0"])
    assert result.exit_code == 0, result.output
    assert result.output.count("// Generated by loomc") == 1
    assert re.findall(r'^extern "C" __global__ void (\w+)\(', result.output, re.M) == ["k_matmul_q8_0", "k_embed_f32"]
    assert "// kernel matmul_q8_0: loomc/motifs/quant.loom:38 -> k_matmul_q8_0" in result.output


# ---- every kernel in the repository compiles --------------------------------------------------

def repo_kernel_files() -> list[Path]:
    """Motifs, samples and test fixtures that define kernels and check clean."""
    candidates = sorted({*REPO.glob("loomc/motifs/*.loom"), *REPO.glob("samples/**/*.loom"),
                         *REPO.glob("tests/**/*.loom")})
    found = []
    for path in candidates:
        try:
            items = parse_module(path.read_text(), str(path)).items
        except Exception:  # fixtures of syntax errors
            continue
        if any(isinstance(item, ast.Kernel) for item in items) and (
                not path.is_relative_to(REPO / "tests") or load_files([path]).ok):
            found.append(path)
    return found


def nvcc_ptx(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([NVCC, "--ptx", "-arch=sm_80", *cuda.COMPILE_OPTIONS, "-x", "cu", str(path),
                           "-o", os.devnull], capture_output=True, text=True)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_repo_kernel_compiles_with_nvcc(tmp_path):
    """One translation unit (one module, as loomc.run.cuda compiles it) per `.loom` file."""
    files = repo_kernel_files()
    assert {p.name for p in files} >= {"quant.loom", "sampling.loom", "attention.loom", "semantics.loom"}
    units = []
    for path in files:
        unit = tmp_path / f"{path.parent.name}_{path.stem}.cu"
        unit.write_text(cuda.render_module(groups_of(path)).text)
        units.append(unit)
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(nvcc_ptx, units))
    failures = [f"{unit.name}:\n{r.stderr}" for unit, r in zip(units, results) if r.returncode != 0]
    assert not failures, "\n".join(failures)


# ---- drift: the renderer's scalar code on the host against the interpreter ----------------------

_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_FLOAT = {"f16": np.float16, "f32": np.float32, "f64": np.float64}
_SAME_WIDTH = {8: "unsigned char", 16: "unsigned short", 32: "unsigned int", 64: "unsigned long long"}


def to_value(bits: int, dtype: str):
    """The interpreter's representation of a bit pattern of `dtype`."""
    if dtype == "bool":
        return bits != 0
    if ir.is_int(dtype):
        return interpret.wrap(bits, dtype)
    if dtype == "bf16":
        return np.array(bits << 16, np.uint32).view(np.float32)[()]
    return np.array(bits, _UINT[ir.BITS[dtype]]).view(_FLOAT[dtype])[()]


def to_bits(value, dtype: str) -> int:
    if dtype == "bool":
        return int(bool(value))
    if ir.is_int(dtype):
        return int(value) & ((1 << ir.BITS[dtype]) - 1)
    if dtype == "bf16":
        return int(np.array(value, np.float32).view(np.uint32)) >> 16
    return int(np.array(value, _FLOAT[dtype]).view(_UINT[ir.BITS[dtype]]))


def c_in(dtype: str, x: str) -> str:
    if dtype == "bool":
        return f"({x} != 0)"
    if ir.is_int(dtype):
        return f"(({cuda.C_TYPE[dtype]}){x})"
    return f"lm_{dtype}_from_bits(({'unsigned long long' if dtype == 'f64' else 'unsigned int'}){x})"


def c_out(dtype: str, r: str) -> str:
    if dtype == "bool":
        return f"(unsigned long long)({r} ? 1 : 0)"
    if ir.is_int(dtype):
        return f"(unsigned long long)({_SAME_WIDTH[ir.BITS[dtype]]})({r})"
    return f"(unsigned long long)lm_{dtype}_bits({r})"


def int_edges(dtype: str) -> list[int]:
    bits = ir.BITS[dtype]
    lo, hi = (0, (1 << bits) - 1) if ir.is_unsigned(dtype) else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    values = {0, 1, 2, 3, 7, hi, hi - 1, lo, lo + 1, hi // 3, 0x5A5A5A5A5A5A5A5A & hi}
    if lo < 0:
        values |= {-1, -2, -3, -7, lo // 3}
    return sorted(values)


F32_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, 1.5, -2.5, 3.0, 1 / 3, -7.25, 1e-3, 1e30, -3.4028234663852886e38,
             1.1754943508222875e-38, 1.401298464324817e-45, 1 + 2 ** -23, 1 - 2 ** -24, 65504.0, 65520.0,
             2 ** -24, 2 ** -25, 1 + 2 ** -11, float("inf"), float("-inf"), float("nan")]
F64_EXTRA = [1e300, -1e-300, 5e-324, 1 + 2 ** -52, 1 + 2 ** -11 + 2 ** -40, 0.1]


def float_edges(dtype: str) -> list[int]:
    values = F32_EDGES + (F64_EXTRA if dtype == "f64" else [])
    with np.errstate(over="ignore"):
        return sorted({to_bits(interpret.to_dtype(v, dtype), dtype) for v in values})


def edges(dtype: str) -> list[int]:
    return [0, 1] if dtype == "bool" else int_edges(dtype) if ir.is_int(dtype) else float_edges(dtype)


def pairs(dtype: str):
    e = edges(dtype)
    return [(a, b) for a in e for b in e]


def ref(name: str, dtype: str) -> ir.Ref:
    return ir.Ref(name, dtype)


# Transcendental functions: the target's math library, not the IR, decides the last bits.
INEXACT = {"exp", "exp2", "log", "log2", "tanh", "erf", "sin", "cos", "sigmoid", "pow"}
ULPS = {"f16": 1, "bf16": 1, "f32": 4, "f64": 4}


def drift_cases():
    """(expression, its parameters, input bit tuples). Undefined inputs (shifts outside
    0..bits-1, float -> int out of range) are left out, as the IR leaves them undefined."""
    cases = []
    a, b = "a", "b"
    for t in ir.INT_DTYPES:
        both = [(a, t), (b, t)]
        for op in ("add", "sub", "mul", "div", "mod", "and", "or", "xor", "lt", "ge", "eq"):
            dtype = "bool" if op in ir.COMPARE_OPS else t
            cases.append((ir.Binary(op, ref(a, t), ref(b, t), dtype), both, pairs(t)))
        for op in ("shl", "shr"):
            amounts = [0, 1, 3, ir.BITS[t] // 2, ir.BITS[t] - 1]
            cases.append((ir.Binary(op, ref(a, t), ref(b, t), t), both, [(x, s) for x in edges(t) for s in amounts]))
        for fn in ("min", "max"):
            cases.append((ir.Math(fn, (ref(a, t), ref(b, t)), t), both, pairs(t)))
        for op in ("neg", "invert"):
            cases.append((ir.Unary(op, ref(a, t), t), [(a, t)], [(x,) for x in edges(t)]))
        cases.append((ir.Math("abs", (ref(a, t),), t), [(a, t)], [(x,) for x in edges(t)]))
    for t in ir.FLOAT_DTYPES:
        both = [(a, t), (b, t)]
        for op in ("add", "sub", "mul", "div", "mod", "lt", "le", "eq", "ne"):
            dtype = "bool" if op in ir.COMPARE_OPS else t
            cases.append((ir.Binary(op, ref(a, t), ref(b, t), dtype), both, pairs(t)))
        for fn in ("min", "max"):
            cases.append((ir.Math(fn, (ref(a, t), ref(b, t)), t), both, pairs(t)))
        # pow(-inf, y) for non-integer y is +inf in C99 (CUDA, glibc, numba's math.pow) but NaN
        # from the interpreter's np.power (numpy's SIMD pow): a reference quirk, left out here
        minus_inf = to_bits(interpret.to_dtype(float("-inf"), t), t)
        cases.append((ir.Math("pow", (ref(a, t), ref(b, t)), t), both, [(x, y) for x, y in pairs(t) if x != minus_inf]))
        cases.append((ir.Unary("neg", ref(a, t), t), [(a, t)], [(x,) for x in edges(t)]))
        for fn in ("sqrt", "rsqrt", "floor", "ceil", "abs", "isnan", "isinf", "exp", "exp2", "log", "log2", "tanh",
                   "erf", "sin", "cos", "sigmoid"):
            dtype = "bool" if fn in ("isnan", "isinf") else t
            cases.append((ir.Math(fn, (ref(a, t),), dtype), [(a, t)], [(x,) for x in edges(t)]))
        # fma rounds once; these products and sums are exact or far from a tie, where the
        # interpreter's f64 emulation is exact too
        triples = [(1 + 2 ** -23, 1 - 2 ** -23, -(1 + 2 ** -23)), (2.0, 3.0, 1.0), (0.1, 10.0, -1.0),
                   (float("inf"), 0.0, 1.0), (-0.0, 5.0, -0.0), (1e-3, -1e-3, 1e-6)]
        if t == "f64":
            triples = [(2.0, 3.0, 1.0), (-0.0, 5.0, -0.0), (float("inf"), 2.0, 1.0)]
        with np.errstate(over="ignore"):
            inputs = [tuple(to_bits(interpret.to_dtype(v, t), t) for v in trio) for trio in triples]
        cases.append((ir.Math("fma", (ref(a, t), ref(b, t), ref("c", t)), t), both + [("c", t)], inputs))
    for src in ir.DTYPES:
        if src == "bool":
            continue
        for dst in ir.DTYPES:
            inputs = [(x,) for x in edges(src)]
            if ir.is_float(src) and ir.is_int(dst):
                half = 2 ** (ir.BITS[dst] - 1)
                lo, hi = (0, 2 * half) if ir.is_unsigned(dst) else (-half, half)
                inputs = [(x,) for (x,) in inputs if np.isfinite(v := to_value(x, src)) and lo <= int(v) < hi]
            cases.append((ir.Cast(ref(a, src), dst), [(a, src)], inputs))
    for src in ir.DTYPES:
        for dst in ir.DTYPES:
            if src != dst and ir.BITS[src] == ir.BITS[dst]:
                inputs = [(x,) for x in edges(src) if not ir.is_float(src) or not np.isnan(to_value(x, src))]
                cases.append((ir.Bitcast(ref(a, src), dst), [(a, src)], inputs + [(x,) for x in canonical_nan(src)]))
    # selects and short-circuit logic
    p, q = ref("p", "bool"), ref("q", "bool")
    bools = [(x, y) for x in (0, 1) for y in (0, 1)]
    for op in ("land", "lor", "eq", "ne"):
        cases.append((ir.Binary(op, p, q, "bool"), [("p", "bool"), ("q", "bool")], bools))
    cases.append((ir.Unary("not", p, "bool"), [("p", "bool")], [(0,), (1,)]))
    for t in ("i8", "u64", "f16", "f32"):
        cases.append((ir.Select(p, ref(a, t), ref(b, t), t), [("p", "bool"), (a, t), (b, t)],
                      [(c, x, y) for c in (0, 1) for x, y in pairs(t)[:20]]))
    return cases


def canonical_nan(dtype: str) -> list[int]:
    return {"f16": [0x7E00, 0xFE00], "bf16": [0x7FC0], "f32": [0x7FC00000], "f64": [0x7FF8000000000000]}.get(dtype, [])


def ordinal(bits: int, dtype: str) -> int:
    """Float bit patterns in order (so that ulp distance is a difference)."""
    width = 16 if dtype == "bf16" else ir.BITS[dtype]
    sign = 1 << (width - 1)
    return -(bits & (sign - 1)) if bits & sign else bits


def is_nan_bits(bits: int, dtype: str) -> bool:
    return ir.is_float(dtype) and bool(np.isnan(to_value(bits, dtype)))


def harness(cases) -> str:
    functions, dispatch = [], []
    for i, (expr, params, _) in enumerate(cases):
        functions.append(cuda.render_scalar_function(f"f{i}", params, expr))
        args = ", ".join(c_in(t, "xyz"[j]) for j, (_, t) in enumerate(params))
        dispatch.append(f"        case {i}: r = {c_out(expr.dtype, f'f{i}({args})')}; break;")
    main_fn = ("int main(void) {\n    int id;\n    unsigned long long x, y, z, r;\n"
               "    while (scanf(\"%d %llx %llx %llx\", &id, &x, &y, &z) == 4) {\n"
               "        r = 0;\n        switch (id) {\n"
               + "\n".join(dispatch) + "\n        }\n        printf(\"%llx\\n\", r);\n    }\n    return 0;\n}\n")
    return "#include <math.h>\n#include <stdio.h>\n\n" + cuda.with_helpers("".join(functions) + main_fn)


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++) to run the renderer's scalar code")
def test_scalar_code_matches_the_interpreter_on_the_host(tmp_path):
    cases = drift_cases()
    program = tmp_path / "drift.cc"
    program.write_text(harness(cases))
    exe = tmp_path / "drift"
    build = subprocess.run([CXX, "-std=c++17", "-O1", "-ffp-contract=off", "-fno-fast-math", str(program),
                            "-o", str(exe), "-lm"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    rows = [(i, inputs) for i, (_, _, all_inputs) in enumerate(cases) for inputs in all_inputs]
    stdin = "".join(f"{i} " + " ".join(f"{v:x}" for v in (tuple(inputs) + (0, 0, 0))[:3]) + "\n" for i, inputs in rows)
    run = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True)
    got = [int(line, 16) for line in run.stdout.split()]
    assert len(got) == len(rows)
    mismatches = []
    for (i, inputs), bits in zip(rows, got):
        expr, params, _ = cases[i]
        env = {name: to_value(x, t) for (name, t), x in zip(params, inputs)}
        with np.errstate(all="ignore"):
            want = to_bits(interpret.evaluate(expr, env), expr.dtype)
        if want == bits or is_nan_bits(want, expr.dtype) and is_nan_bits(bits, expr.dtype):
            continue
        fn = getattr(expr, "fn", None)
        if fn in INEXACT and not is_nan_bits(want, expr.dtype) and not is_nan_bits(bits, expr.dtype) \
                and abs(ordinal(want, expr.dtype) - ordinal(bits, expr.dtype)) <= ULPS[expr.dtype]:
            continue
        mismatches.append(f"{expr!r} at {[hex(x) for x in inputs]}: C gives {bits:#x}, interpret {want:#x}")
    assert not mismatches, f"{len(mismatches)} of {len(rows)} differ:\n" + "\n".join(mismatches[:40])
    assert len(rows) > 10000  # the table really ran


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++)")
def test_half_conversions_are_exact_over_every_f16_and_many_f32(tmp_path):
    """Every f16 bit pattern decodes exactly; f32 -> f16/bf16 rounds to nearest even."""
    rng = np.random.default_rng(7)
    program = tmp_path / "half.cc"
    program.write_text("#include <stdio.h>\n\n" + cuda.with_helpers(
        "int main(void) {\n    unsigned int h, f;\n"
        "    for (h = 0; h < 65536u; ++h) printf(\"%x\\n\", lm_f32_bits(lm_f16_from_bits(h)));\n"
        "    while (scanf(\"%x\", &f) == 1) printf(\"%x %x\\n\", (unsigned)lm_f16_bits(lm_f32_from_bits(f)),"
        " (unsigned)lm_bf16_bits(lm_f32_from_bits(f)));\n    return 0;\n}\n"))
    exe = tmp_path / "half"
    build = subprocess.run([CXX, "-std=c++17", "-O1", "-ffp-contract=off", str(program), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    x = np.concatenate([(rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, 20000)).astype(np.float32),
                        np.arange(1, 2048, dtype=np.float32) * np.float32(2 ** -24),
                        np.array([65504, 65519.99, 65520, 1e6, -1e6, 2.98e-8, 3e-8, 0.0, -0.0, np.inf, -np.inf,
                                  1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -8, 1 + 3 * 2 ** -8], np.float32)])
    run = subprocess.run([str(exe)], input="".join(f"{v:x}\n" for v in x.view(np.uint32)), capture_output=True,
                         text=True, check=True)
    out = run.stdout.split("\n")
    decoded = np.array([int(v, 16) for v in out[:65536]], np.uint64).astype(np.uint32).view(np.float32)
    want = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(decoded.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    assert np.isnan(decoded[nan]).all()
    halves = np.array([[int(v, 16) for v in line.split()] for line in out[65536:] if line])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(halves[:, 0], x.astype(np.float16).view(np.uint16))
    bf16 = [to_bits(interpret.to_dtype(float(v), "bf16"), "bf16") for v in x]
    np.testing.assert_array_equal(halves[:, 1], bf16)
