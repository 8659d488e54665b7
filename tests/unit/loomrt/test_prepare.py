"""loomrt/prepare.py: param declarations run against a checkpoint, into what command programs bind."""

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize, quantize
from safetensors.numpy import save_file

from loomc.check import load_files
from loomc.check.document import load_document
from loomrt.checkpoints import open_checkpoint
from loomrt.errors import CheckpointError, LoomError, PrepareError
from loomc.lower.prepare import prepare_plan
from loomrt.prepare import prepare_params

Q = gguf.GGMLQuantizationType
TINY = Path(__file__).resolve().parents[2] / "numerics" / "fixtures" / "tiny"
CONFIGS = "config layers: i64 = 3\nconfig dim: i64 = 64\nconfig rows: i64 = 4\n"


def prepare(tmp_path, source, tensors, name="w.safetensors"):
    """Check `source` (configs prepended) as a loose file and prepare it from a safetensors file."""
    (tmp_path / "p.loom").write_text(CONFIGS + source)
    checked = load_files([tmp_path / "p.loom"])
    assert checked.ok, [d.message for d in checked.diagnostics]
    save_file(tensors, str(tmp_path / name))
    return prepare_params(prepare_plan(checked), open_checkpoint(tmp_path / name))


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(11)


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- the preparation functions ---------------------------------------------------------


def test_checkpoint_and_family(tmp_path, rng):
    norm = f32(rng, 64)
    layers = [f32(rng, 4, 64) for _ in range(3)]
    out = prepare(tmp_path, 'param norm: f32[dim] = checkpoint("output_norm.weight")\n'
                            'param w[l in 0..layers]: f32[rows, dim] = checkpoint("blk.{l}.w")\n'
                            'param tail[i in 1..layers]: f32[rows, dim] = checkpoint("blk.{i}.w")\n',
                  {"output_norm.weight": norm, **{f"blk.{i}.w": w for i, w in enumerate(layers)}})
    assert list(out) == ["norm", "w", "tail"]
    np.testing.assert_array_equal(out["norm"], norm)
    assert isinstance(out["w"], list) and len(out["w"]) == 3 and len(out["tail"]) == 2
    for got, want in zip(out["w"], layers):
        assert got.dtype == np.float32 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(out["tail"][0], layers[1])


def test_transpose(tmp_path, rng):
    w = f32(rng, 64, 4)
    out = prepare(tmp_path, 'param w: f32[rows, dim] = transpose(checkpoint("w"))\n', {"w": w})
    assert out["w"].flags.c_contiguous
    np.testing.assert_array_equal(out["w"], w.T)


def test_casts(tmp_path, rng):
    w = f32(rng, 4, 64)
    w[0, :3] = [1.0, 1.00390625, -2.5]  # the second is halfway: it rounds to even in bf16
    i = np.arange(-3, 5, dtype=np.int32)
    out = prepare(tmp_path, 'param h: f16[rows, dim] = cast(checkpoint("w"), f16)\n'
                            'param b: bf16[rows, dim] = cast(checkpoint("w"), bf16)\n'
                            'param back: f32[rows, dim] = cast(cast(checkpoint("w"), bf16), f32)\n'
                            'param d: f64[8] = cast(checkpoint("i"), f64)\n'
                            'param t: bool[8] = cast(checkpoint("i"), bool)\n'
                            'param u: i8[8] = cast(checkpoint("i"), i8)\n', {"w": w, "i": i})
    assert out["h"].dtype == np.float16
    np.testing.assert_array_equal(out["h"], w.astype(np.float16))
    assert out["b"].dtype == np.uint16 and out["b"].shape == (4, 64)
    assert out["b"][0, :3].tolist() == [0x3F80, 0x3F80, 0xC020]
    np.testing.assert_allclose(out["back"], w, rtol=2 ** -8)
    np.testing.assert_array_equal(out["back"], (out["b"].astype(np.uint32) << 16).view(np.float32))
    assert out["d"].dtype == np.float64 and out["d"].tolist() == list(range(-3, 5))
    assert out["t"].dtype == np.bool_ and out["t"].tolist() == [v != 0 for v in range(-3, 5)]
    assert out["u"].dtype == np.int8


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0", "q4_1"])
def test_quantize_and_dequantizing_cast(tmp_path, rng, qtype):
    w = f32(rng, 4, 64)
    out = prepare(tmp_path, f'param q: {qtype}[rows, dim] = quantize(checkpoint("w"), {qtype})\n'
                            f'param d: f32[rows, dim] = cast(quantize(checkpoint("w"), {qtype}), f32)\n', {"w": w})
    want = quantize(w, Q[qtype.upper()])
    assert out["q"].dtype == np.uint8 and out["q"].shape == want.shape and out["q"].flags.c_contiguous
    np.testing.assert_array_equal(out["q"], want)
    np.testing.assert_array_equal(out["d"], dequantize(want, Q[qtype.upper()]))


def test_concat(tmp_path, rng):
    a, b, c = f32(rng, 2, 64), f32(rng, 2, 64), f32(rng, 4, 32)
    out = prepare(tmp_path, 'param rows0: f32[rows, dim] = concat([checkpoint("a"), checkpoint("b")], 0)\n'
                            'param cols: f32[rows, 2 * dim - 64 + 32] = '
                            'concat([checkpoint("w"), checkpoint("c")], -1)\n'
                            'param q: q8_0[rows, 96] = concat([quantize(checkpoint("w"), q8_0), '
                            'quantize(checkpoint("c"), q8_0)], 1)\n',
                  {"a": a, "b": b, "c": c, "w": np.vstack([a, b])})
    np.testing.assert_array_equal(out["rows0"], np.vstack([a, b]))
    np.testing.assert_array_equal(out["cols"], np.hstack([np.vstack([a, b]), c]))
    np.testing.assert_array_equal(out["q"], quantize(np.hstack([np.vstack([a, b]), c]), Q.Q8_0))


def test_reshape(tmp_path, rng):
    w = f32(rng, 4, 64)
    out = prepare(tmp_path, 'param flat: f32[rows * dim] = reshape(checkpoint("w"), [rows * dim])\n'
                            'param q: q4_1[2, 128] = reshape(quantize(checkpoint("w"), q4_1), [2, dim * 2])\n',
                  {"w": w})
    np.testing.assert_array_equal(out["flat"], w.reshape(-1))
    np.testing.assert_array_equal(out["q"], quantize(w.reshape(2, 128), Q.Q4_1))


def test_repack_interleaves_rows_in_panels(tmp_path, rng):
    w = f32(rng, 32, 64)
    out = prepare(tmp_path, 'param p: q4_1x16[32, dim] = repack(quantize(checkpoint("w"), q4_1), q4_1x16)\n'
                            'param e: q8_0x16[32, dim] = repack(quantize(checkpoint("w"), q8_0), q8_0x16)\n'
                            'param d: f32[32, dim] = cast(repack(quantize(checkpoint("w"), q4_1), q4_1x16), f32)\n'
                            'param f: f32[32, dim] = cast(repack(quantize(checkpoint("w"), q8_0), q8_0x16), f32)\n',
                  {"w": w})
    for name, qtype, size, head in (("p", Q.Q4_1, 20, 4), ("e", Q.Q8_0, 34, 2)):
        plain = quantize(w, qtype).reshape(2, 16, 2, size)   # 2 panels of 16 rows, 2 blocks per row
        assert out[name].shape == (32, 2 * size) and out[name].dtype == np.uint8 and out[name].flags.c_contiguous
        panels = out[name].reshape(2, 2, 16 * size)       # per panel and block: the rows' fields, then codes,
        for g in range(2):                                # each 2 bytes per row at a time
            for b in range(2):
                for r in range(16):
                    for unit in range(size // 2):
                        at = 32 * unit + 2 * r
                        assert bytes(panels[g, b, at:at + 2]) == bytes(plain[g, r, b, 2 * unit:2 * unit + 2])
    # a cast reads panels back
    np.testing.assert_array_equal(out["d"], dequantize(quantize(w, Q.Q4_1), Q.Q4_1))
    np.testing.assert_array_equal(out["f"], dequantize(quantize(w, Q.Q8_0), Q.Q8_0))


def test_composed_preparation(tmp_path, rng):
    w = f32(rng, 64, 4)
    out = prepare(tmp_path, 'param w: q8_0[rows, dim] = '
                            'quantize(cast(transpose(cast(checkpoint("w"), f16)), f32), q8_0)\n',
                  {"w": w})
    np.testing.assert_array_equal(out["w"], quantize(w.T.astype(np.float16).astype(np.float32), Q.Q8_0))


# ---- failures ---------------------------------------------------------------------------


def failure(tmp_path, source, tensors):
    with pytest.raises(PrepareError) as info:
        prepare(tmp_path, source, tensors)
    assert isinstance(info.value, CheckpointError) and isinstance(info.value, LoomError)
    assert info.value.status == 500 and info.value.code == "prepare_error"
    return info.value


def test_missing_tensor(tmp_path, rng):
    e = failure(tmp_path, 'param w[l in 0..layers]: f32[rows, dim] = checkpoint("blk.{l}.w")\n',
                {"blk.0.w": f32(rng, 4, 64), "blk.1.w": f32(rng, 4, 64)})
    assert e.message.startswith("param 'w'[2] (blk.2.w): checkpoint w.safetensors has no tensor 'blk.2.w'; "
                                "did you mean ")
    assert e.param == "w"


def test_repack_refusals(tmp_path, rng):
    e = failure(tmp_path, 'param p: q4_1x16[16, dim] = repack(quantize(checkpoint("w"), q8_0), q4_1x16)\n',
                {"w": f32(rng, 16, 64)})
    assert e.message == "param 'p' (w): repack to q4_1x16 takes a q4_1 tensor, got q8_0[16, 64]"
    e = failure(tmp_path, 'param p: q4_1x16[16, 2 * dim] = concat([repack(quantize(checkpoint("w"), q4_1), q4_1x16), '
                          'repack(quantize(checkpoint("w"), q4_1), q4_1x16)], 1)\n', {"w": f32(rng, 16, 64)})
    assert "would split its panels" in e.message


def test_wrong_dtype(tmp_path, rng):
    e = failure(tmp_path, 'param w: f32[rows, dim] = checkpoint("w")\n', {"w": f32(rng, 4, 64).astype(np.float16)})
    assert e.message == "param 'w' (w): expected f32[4, 64], got f16[4, 64]"


def test_wrong_shape_of_a_family_member(tmp_path, rng):
    tensors = {f"blk.{i}.attn_q.weight": f32(rng, 64, 64) for i in range(3)}
    tensors["blk.1.attn_q.weight"] = f32(rng, 64, 32)
    e = failure(tmp_path, 'param wq[l in 0..layers]: q4_1[dim, dim] = '
                          'quantize(checkpoint("blk.{l}.attn_q.weight"), q4_1)\n',
                tensors)
    assert e.message == "param 'wq'[1] (blk.1.attn_q.weight): expected q4_1[64, 64], got q4_1[64, 32]"


def test_gguf_quantized_member_mismatch(tmp_path, rng):
    """The brief's example shape: a q4_1 GGUF tensor whose row length differs from the declaration."""
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    for i in range(3):
        cols = 32 if i == 2 else 64
        w.add_tensor(f"blk.{i}.attn_q.weight", quantize(f32(rng, 64, cols), Q.Q4_1), raw_dtype=Q.Q4_1)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    (tmp_path / "p.loom").write_text(
        CONFIGS + 'param wq[l in 0..layers]: q4_1[dim, dim] = checkpoint("blk.{l}.attn_q.weight")\n')
    checked = load_files([tmp_path / "p.loom"])
    with pytest.raises(PrepareError, match=r"^param 'wq'\[2\] \(blk\.2\.attn_q\.weight\): expected q4_1\[64, 64\], "
                                           r"got q4_1\[64, 32\]$"):
        prepare_params(prepare_plan(checked), open_checkpoint(tmp_path / "m.gguf"))


def test_preparation_failures_name_every_tensor(tmp_path, rng):
    a, b = f32(rng, 2, 64), f32(rng, 2, 32)
    cases = [
        ('param w: f32[rows, dim] = concat([checkpoint("a"), checkpoint("b")], 0)\n',
         r"^param 'w' \(a, b\): concat along axis 0: f32\[2, 64\] and f32\[2, 32\] differ in another dimension$"),
        ('param w: f32[rows, dim] = concat([checkpoint("a"), cast(checkpoint("a"), f16)], 0)\n',
         r"concat needs tensors of one dtype, got f32\[2, 64\], f16\[2, 64\]"),
        ('param w: f32[rows, dim] = concat([checkpoint("a"), checkpoint("a")], 2)\n',
         r"concat axis 2 is outside the 2 dimensions"),
        ('param w: f32[rows, dim] = reshape(checkpoint("a"), [rows, dim])\n',
         r"^param 'w' \(a\): cannot reshape f32\[2, 64\] \(128 elements\) to \[4, 64\]$"),
        ('param w: q8_0[2, 64] = reshape(reshape(quantize(checkpoint("a"), q8_0), [8, 16]), [2, 64])\n',
         r"cannot reshape q8_0\[2, 64\] to \[8, 16\]: q8_0 keeps whole blocks of 32"),
        ('param w: q8_0[rows, 32] = quantize(reshape(checkpoint("b"), [rows, 16]), q8_0)\n',
         r"quantize to q8_0 needs a last dimension that is a multiple of 32, got f32\[4, 16\]"),
        ('param w: q8_0[2, dim] = quantize(quantize(checkpoint("a"), q8_0), q8_0)\n',
         r"already block-quantized"),
        ('param w: q8_0[dim, 32] = transpose(quantize(checkpoint("a"), q8_0))\n',
         r"^param 'w' \(a\): cannot transpose q8_0\[2, 64\]: block-quantized"),
    ]
    for source, message in cases:
        with pytest.raises(PrepareError, match=message):
            prepare(tmp_path, source, {"a": a, "b": b})


def test_unchecked_program_is_refused(tmp_path):
    (tmp_path / "p.loom").write_text(CONFIGS + 'param w: f32[rows, dim] = checkpoint("blk.{l}.w")\n')
    checked = load_files([tmp_path / "p.loom"])
    assert not checked.ok
    with pytest.raises(ValueError, match="the program has diagnostics"):
        prepare_plan(checked)  # a plan exists only for a checked program: preparation never sees one


# ---- end to end: the tiny model's command program from prepared weights -------------------

LAYERS, DIM, KV_DIM, FFN, VOCAB = 2, 64, 32, 96, 80
QUANTIZED = {"wq": ("attn_q", "q4_0", DIM), "wk": ("attn_k", "q4_0", KV_DIM), "wv": ("attn_v", "q4_1", KV_DIM),
             "w_gate": ("ffn_gate", "q4_1", FFN), "w_up": ("ffn_up", "q4_1", FFN), "w_down": ("ffn_down", "q4_1", DIM)}


@pytest.fixture(scope="module")
def tiny_program():
    from loomc.run.compile import compile_command
    checked = load_document(TINY / "model.json")
    assert checked.ok, checked.diagnostics
    return checked, compile_command(checked, "prefill_decode")


@pytest.fixture(scope="module")
def tiny_weights():
    """Float checkpoint tensors (HF-like: wo stored transposed) and the params built directly."""
    rng = np.random.default_rng(5)
    tensors, params = {}, {}
    tensors["token_embd.weight"] = f32(rng, VOCAB, DIM)
    params["token_embd"] = quantize(tensors["token_embd.weight"], Q.Q8_0)
    tensors["output_norm.weight"] = 1 + 0.1 * f32(rng, DIM)
    params["output_norm"] = tensors["output_norm.weight"]
    for l in range(LAYERS):
        for name, (tensor, qtype, rows) in QUANTIZED.items():
            cols = FFN if name == "w_down" else DIM
            w = 0.15 * f32(rng, rows, cols)
            tensors[f"blk.{l}.{tensor}.weight"] = w
            params.setdefault(name, []).append(quantize(w, Q[qtype.upper()]))
        for name in ("attn_norm", "ffn_norm"):
            tensors[f"blk.{l}.{name}.weight"] = 1 + 0.1 * f32(rng, DIM)
            params.setdefault(name, []).append(tensors[f"blk.{l}.{name}.weight"])
        wo = 0.1 * f32(rng, DIM, DIM)
        tensors[f"blk.{l}.attn_output.weight_t"] = np.ascontiguousarray(wo.T)
        params.setdefault("wo", []).append(wo)
    return tensors, params


def tiny_step(program, params):
    state = {k: np.zeros((6, LAYERS, 4, KV_DIM), np.float32) for k in ("k_cache", "v_cache")}
    tokens = np.array([3, 17, 42, 5, 79], np.int32)
    rows = np.array([0, 0, 0, 1, 1], np.int32)
    positions = np.array([0, 1, 2, 0, 1], np.int32)
    inputs = dict(tokens=tokens, positions=positions, rows=rows, page_table=np.array([[4, 1], [0, 5]], np.int32),
                  last=np.array([2, 4], np.int32), temperature=np.zeros(2, np.float32),
                  top_p=np.ones(2, np.float32), top_k=np.zeros(2, np.int32),
                  seed=np.arange(2, dtype=np.uint64), counter=np.zeros(2, np.uint64))
    return program.run(params, state, inputs)


def test_tiny_model_from_prepared_safetensors(tmp_path, tiny_program, tiny_weights):
    """A prepare program that quantizes float safetensors weights (and transposes wo) feeds the
    fixture's compiled command program exactly like the arrays built directly."""
    _, program = tiny_program
    tensors, direct = tiny_weights
    lines = [f'use "{TINY / "control.loom"}" {{ layers, dim, kv_dim, ffn, vocab, page_size }}',
             'param token_embd: q8_0[vocab, dim] = quantize(checkpoint("token_embd.weight"), q8_0)',
             'param attn_norm[l in 0..layers]: f32[dim] = checkpoint("blk.{l}.attn_norm.weight")',
             'param wo[l in 0..layers]: f32[dim, dim] = transpose(checkpoint("blk.{l}.attn_output.weight_t"))',
             'param ffn_norm[l in 0..layers]: f32[dim] = checkpoint("blk.{l}.ffn_norm.weight")',
             'param output_norm: f32[dim] = checkpoint("output_norm.weight")']
    for name, (tensor, qtype, rows) in QUANTIZED.items():
        cols = "ffn" if name == "w_down" else "dim"
        shape = {DIM: "dim", KV_DIM: "kv_dim", FFN: "ffn"}[rows]
        lines.append(f'param {name}[l in 0..layers]: {qtype}[{shape}, {cols}] = '
                     f'quantize(checkpoint("blk.{{l}}.{tensor}.weight"), {qtype})')
    (tmp_path / "prepare.loom").write_text("\n".join(lines) + "\n")
    checked = load_files([tmp_path / "prepare.loom"])
    assert checked.ok, [d.message for d in checked.diagnostics]
    save_file(tensors, str(tmp_path / "tiny.safetensors"))
    params = prepare_params(prepare_plan(checked), open_checkpoint(tmp_path / "tiny.safetensors"))
    assert sorted(params) == sorted(direct)
    for name, value in direct.items():
        got = params[name] if isinstance(value, list) else [params[name]]
        for g, w in zip(got, value if isinstance(value, list) else [value]):
            np.testing.assert_array_equal(g, w)
    want = tiny_step(program, direct)
    got = tiny_step(program, params)
    np.testing.assert_array_equal(got["logits"], want["logits"])
    np.testing.assert_array_equal(got["next"], want["next"])
    assert np.isfinite(got["logits"]).all() and np.abs(got["logits"]).max() > 0


def test_tiny_document_prepares_from_gguf(tmp_path, tiny_program, tiny_weights):
    """The fixture's own prepare.loom (the document's `prepare` role) against a GGUF file whose
    quantized tensors are used in place: no copy, same program output."""
    checked, program = tiny_program
    assert {p.name for p in prepare_plan(checked).params} == set(tiny_weights[1])
    tensors, direct = tiny_weights
    w = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "llama")
    w.add_tensor("token_embd.weight", direct["token_embd"], raw_dtype=Q.Q8_0)
    w.add_tensor("output_norm.weight", direct["output_norm"])
    for l in range(LAYERS):
        for name, (tensor, qtype, _) in QUANTIZED.items():
            w.add_tensor(f"blk.{l}.{tensor}.weight", direct[name][l], raw_dtype=Q[qtype.upper()])
        for name, tensor in (("attn_norm", "attn_norm"), ("ffn_norm", "ffn_norm"), ("wo", "attn_output")):
            w.add_tensor(f"blk.{l}.{tensor}.weight", direct[name][l])
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    params = prepare_params(prepare_plan(checked), open_checkpoint(tmp_path / "tiny.gguf"))
    # The memory-mapped GGUF bytes, bound in place; writeable (copy-on-write) so the kernels
    # compiled for the direct arrays are reused rather than recompiled for read-only arrays.
    assert isinstance(params["wq"][0].base, np.memmap) and params["wq"][0].flags.writeable
    np.testing.assert_array_equal(params["wv"][1], direct["wv"][1])
    np.testing.assert_array_equal(tiny_step(program, params)["logits"], tiny_step(program, direct)["logits"])


def test_compute_runs_a_kernel_once_at_preparation(tmp_path):
    """A param made by a kernel: from nothing (no checkpoint needed) or from prepared tensors."""
    (tmp_path / "p.loom").write_text('''config n: i64 = 8

kernel hann(out w: f32[N]) {
    parallel for i in 0..N {
        w[i] = 0.5 - 0.5 * cos(6.283185307179586 * f32(i) / f32(N))
    }
}

kernel scaled(x: f32[N], s: f32, out y: f32[N]) {
    parallel for i in 0..N {
        y[i] = x[i] * s
    }
}

param window: f32[n] = compute(hann)
param twice: f32[n] = compute(scaled, cast(checkpoint("w"), f32), 2.0)
''')
    checked = load_files([tmp_path / "p.loom"])
    assert checked.ok, checked.diagnostics
    plan = prepare_plan(checked)
    assert plan.reads_checkpoint and len(plan.kernels) == 2
    save_file({"w": np.arange(8, dtype=np.float16)}, str(tmp_path / "w.safetensors"))
    params = prepare_params(plan, open_checkpoint(tmp_path / "w.safetensors"))
    np.testing.assert_allclose(params["window"], np.hanning(9)[:8], atol=1e-6)   # periodic Hann
    np.testing.assert_array_equal(params["twice"], np.arange(8, dtype=np.float32) * 2)
    only_window = dataclasses.replace(plan, params=plan.params[:1])
    assert not only_window.reads_checkpoint
    np.testing.assert_array_equal(prepare_params(only_window, None)["window"], params["window"])
